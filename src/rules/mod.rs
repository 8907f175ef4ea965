//! The built-in rule engine: JSON rules from the control topic, applied per key.
//!
//! | file | concept |
//! |---|---|
//! | [`spec`] | rule language v1: serde shape, validation, reason labels |
//! | [`predicate`] | filters, steps, `having`: compiled predicates and JSON pointers |
//! | [`aggregate`] | accumulators and aggregate rules (running, tumbling, sliding, session, compare) |
//! | [`running`] | every running aggregate of a key in one value (one read, one write per event) |
//! | [`window`] | state namespaces and window assignment |
//! | [`windowed`] | every un-grouped window of a key ending at one instant in one value, one timer |
//! | [`dedup`], [`sequence`], [`anomaly`] | the other rule kinds |
//! | [`output`] | the output record |
//! | [`metrics`] | `streamstate_rule_*` metrics |
//!
//! The engine keeps compiled rules in memory, rebuilt from the runtime's broadcast state
//! `rules` in every `open` (start and every restore). All per-key state is keyed state in
//! namespaces that start with the rule id and version (see [`window`]), so a new version
//! starts fresh and a timer knows whether the rule that set it is still in force.
//! A `shadow` rule takes every step an active one does and is stopped only at
//! `Env::emit`, so what it counts is what it would emit once promoted.
//! Language reference: `docs/rules.md`.

pub mod aggregate;
pub mod anomaly;
pub mod dedup;
pub mod metrics;
pub mod output;
pub mod predicate;
pub mod running;
pub mod sequence;
pub mod spec;
pub mod window;
pub mod windowed;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::Value;
use streamstate_state::{
    MapState, MapStateDescriptor, Prefetch, StateStore, TimeDomain, TtlConfig, ValueState,
    ValueStateDescriptor,
};

use crate::config::Config;
use crate::control::StoredRule;
use crate::function::{
    BroadcastContext, BroadcastUpdate, Event, FiredTimer, FunctionError, KeyedContext, OpenContext,
    Output, ProcessFunction, Upcoming,
};
use crate::metrics::Metrics;

use self::aggregate::{Acc, Sessions};
use self::anomaly::ModelState;
use self::metrics::{RuleCounters, RuleMetrics};
use self::sequence::{Buffered, Partial};
use self::spec::{Kind, Rule};

/// What the engine needs from the job's configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineOptions {
    /// `[job] timestamp` is set: windows and sequences close on the watermark.
    pub event_time: bool,
    /// `[job] state_ttl`: per-key state of running aggregates, sequences and anomaly
    /// models expires after this long without a write.
    pub state_ttl: Option<Duration>,
}

/// Keyed-state handles, obtained in `open`.
pub(crate) struct States {
    store: StateStore,
    /// Tumbling/sliding windows without `group_by`, every rule's of a key ending at one
    /// instant in one value (removed when they close).
    pub windows: windowed::Batch,
    /// Window accumulators as written before [`windowed`] (one per rule window): still
    /// closed by their timers, and moved into `windows` by the next event of the window.
    pub win_acc: ValueState<Acc>,
    /// distinct_count values of a window or session.
    pub win_distinct: MapState<String, bool>,
    /// Running aggregates without `group_by`, all rules of a key in one value.
    pub running: running::Batch,
    pub run_distinct: MapState<String, bool>,
    pub sessions: ValueState<Sessions>,
    /// compare: the last closed window values of a key, `(window start, value)`.
    pub history: ValueState<Vec<(i64, f64)>>,
    pub sequence: ValueState<Vec<Partial>>,
    /// Event-time sequences: events waiting for the watermark, by timestamp.
    pub seq_buffer: MapState<u64, Vec<Buffered>>,
    /// How many events `seq_buffer` holds (for its bound).
    pub seq_buffered: ValueState<u64>,
    /// `group_by` accumulators of a window, by the group value's JSON text.
    pub win_groups: MapState<String, Acc>,
    /// `group_by` accumulators of a running aggregate.
    pub run_groups: MapState<String, Acc>,
    pub anomaly: ValueState<ModelState>,
    /// Dedup maps, one state per TTL (a state's TTL is fixed by its descriptor).
    dedup: HashMap<u64, MapState<String, u64>>,
}

/// The engine's fixed keyed states. One list serves `open` and the offline
/// `check-restore` (via [`RuleEngine::declared_states`]), so they cannot disagree.
struct Descriptors {
    windows: ValueStateDescriptor<windowed::Windows>,
    win_acc: ValueStateDescriptor<Acc>,
    win_distinct: MapStateDescriptor<String, bool>,
    running: ValueStateDescriptor<running::Running>,
    /// Running accumulators as written before [`running`] (one per rule namespace):
    /// read while a restored checkpoint still holds any.
    run_acc: ValueStateDescriptor<Acc>,
    run_distinct: MapStateDescriptor<String, bool>,
    sessions: ValueStateDescriptor<Sessions>,
    history: ValueStateDescriptor<Vec<(i64, f64)>>,
    sequence: ValueStateDescriptor<Vec<Partial>>,
    seq_buffer: MapStateDescriptor<u64, Vec<Buffered>>,
    seq_buffered: ValueStateDescriptor<u64>,
    win_groups: MapStateDescriptor<String, Acc>,
    run_groups: MapStateDescriptor<String, Acc>,
    anomaly: ValueStateDescriptor<ModelState>,
}

/// Dedup states are created per TTL on first use: `rules.dedup.<ttl>ms`.
pub const DEDUP_STATE_PREFIX: &str = "rules.dedup.";

impl Descriptors {
    fn new(state_ttl: Option<Duration>) -> Self {
        // A state's TTL cannot be switched on or off once it holds data, so the name says
        // whether it has one: changing `state_ttl` on/off starts these states afresh.
        fn ttl_name(n: &str, ttl: Option<Duration>) -> String {
            if ttl.is_some() {
                format!("{n}.ttl")
            } else {
                n.to_string()
            }
        }
        fn ttl_config(t: Duration) -> TtlConfig {
            TtlConfig::new(t)
                .cleanup_full_snapshot()
                .cleanup_in_rocksdb_compaction_filter()
        }
        fn value<T: Clone>(n: &str, ttl: Option<Duration>) -> ValueStateDescriptor<T> {
            let d = ValueStateDescriptor::new(ttl_name(n, ttl));
            match ttl {
                Some(t) => d.with_ttl(ttl_config(t)),
                None => d,
            }
        }
        let mut run_distinct =
            MapStateDescriptor::new(ttl_name("rules.running.distinct", state_ttl));
        let mut run_groups = MapStateDescriptor::new(ttl_name("rules.running.groups", state_ttl));
        if let Some(t) = state_ttl {
            run_distinct = run_distinct.with_ttl(ttl_config(t));
            run_groups = run_groups.with_ttl(ttl_config(t));
        }
        Self {
            windows: ValueStateDescriptor::new("rules.window.combined"),
            win_acc: ValueStateDescriptor::new("rules.window.acc"),
            win_distinct: MapStateDescriptor::new("rules.window.distinct"),
            running: value("rules.running", state_ttl),
            run_acc: value("rules.running.acc", state_ttl),
            run_distinct,
            sessions: ValueStateDescriptor::new("rules.sessions"),
            history: value("rules.compare.history", state_ttl),
            sequence: value("rules.sequence", state_ttl),
            // No TTL: buffered events leave when the watermark passes them, never by age.
            seq_buffer: MapStateDescriptor::new("rules.sequence.buffer"),
            seq_buffered: ValueStateDescriptor::new("rules.sequence.buffered"),
            win_groups: MapStateDescriptor::new("rules.window.groups"),
            run_groups,
            anomaly: value("rules.anomaly", state_ttl),
        }
    }

    fn declarations(&self) -> Vec<streamstate_state::StateDeclaration> {
        vec![
            self.windows.declaration(),
            self.win_acc.declaration(),
            self.win_distinct.declaration(),
            self.running.declaration(),
            self.run_acc.declaration(),
            self.run_distinct.declaration(),
            self.sessions.declaration(),
            self.history.declaration(),
            self.sequence.declaration(),
            self.seq_buffer.declaration(),
            self.seq_buffered.declaration(),
            self.win_groups.declaration(),
            self.run_groups.declaration(),
            self.anomaly.declaration(),
        ]
    }
}

impl States {
    fn open(ctx: &OpenContext<'_>, state_ttl: Option<Duration>) -> Result<Self, FunctionError> {
        let d = Descriptors::new(state_ttl);
        let legacy = ctx.value_state(&d.run_acc)?;
        let legacy = ctx
            .store
            .state_has_entries(&d.run_acc.name)?
            .then_some(legacy);
        let win_acc = ctx.value_state(&d.win_acc)?;
        let win_legacy = ctx
            .store
            .state_has_entries(&d.win_acc.name)?
            .then(|| win_acc.clone());
        Ok(Self {
            store: ctx.store.clone(),
            windows: windowed::Batch::new(
                ctx.store.clone(),
                ctx.value_state(&d.windows)?,
                win_legacy,
            ),
            win_acc,
            win_distinct: ctx.map_state(&d.win_distinct)?,
            running: running::Batch::new(
                ctx.store.clone(),
                ctx.value_state(&d.running)?,
                legacy,
                state_ttl.map(|t| t.as_millis() as u64),
            ),
            run_distinct: ctx.map_state(&d.run_distinct)?,
            sessions: ctx.value_state(&d.sessions)?,
            history: ctx.value_state(&d.history)?,
            sequence: ctx.value_state(&d.sequence)?,
            seq_buffer: ctx.map_state(&d.seq_buffer)?,
            seq_buffered: ctx.value_state(&d.seq_buffered)?,
            win_groups: ctx.map_state(&d.win_groups)?,
            run_groups: ctx.map_state(&d.run_groups)?,
            anomaly: ctx.value_state(&d.anomaly)?,
            dedup: HashMap::new(),
        })
    }

    /// The dedup map whose entries expire `ttl_ms` after they are written (processing
    /// time), registered on first use.
    pub fn dedup(&mut self, ttl_ms: u64) -> Result<MapState<String, u64>, FunctionError> {
        if let Some(m) = self.dedup.get(&ttl_ms) {
            return Ok(m.clone());
        }
        let ttl = TtlConfig::new(Duration::from_millis(ttl_ms))
            .cleanup_full_snapshot()
            .cleanup_in_rocksdb_compaction_filter();
        let m = self.store.map_state(
            &MapStateDescriptor::new(format!("{DEDUP_STATE_PREFIX}{ttl_ms}ms")).with_ttl(ttl),
        )?;
        self.dedup.insert(ttl_ms, m.clone());
        Ok(m)
    }
}

/// Per-call helpers: time domain, timers, output.
pub(crate) struct Env<'a, 'c> {
    pub ctx: &'a KeyedContext<'c>,
    pub metrics: &'a RuleMetrics,
    /// The counters of the rule in force this call is for (none for a timer of a rule
    /// that was deleted or replaced, which emits nothing).
    pub counters: Option<&'a RuleCounters>,
    pub event_time: bool,
}

impl Env<'_, '_> {
    pub fn register_timer(&self, ts: u64) -> Result<(), FunctionError> {
        if self.event_time {
            self.ctx.register_event_time_timer(ts)
        } else {
            self.ctx.register_processing_time_timer(ts)
        }
    }
    pub fn delete_timer(&self, ts: u64) -> Result<(), FunctionError> {
        if self.event_time {
            self.ctx.delete_event_time_timer(ts)
        } else {
            self.ctx.delete_processing_time_timer(ts)
        }
    }
    /// Watermark in event-time mode; `None` in processing time.
    pub fn watermark(&self) -> Option<u64> {
        if self.event_time {
            self.ctx.current_watermark_ms()
        } else {
            None
        }
    }
    pub fn set_namespace(&self, ns: &[u8]) {
        self.ctx.set_namespace(ns);
    }
    pub fn eval_error(&self, reason: &'static str) {
        self.metrics
            .evaluation_errors
            .with_label_values(&[reason])
            .inc();
    }
    /// Emits `record`, unless the rule is a shadow: then it is only counted, so a shadow
    /// rule runs exactly the code an active one does up to this point.
    pub fn emit(
        &self,
        out: &mut Output,
        rule: &Rule,
        key: &str,
        record: &output::RuleOutput<'_>,
    ) -> Result<(), FunctionError> {
        // No counters: the timer's rule was deleted or replaced, and such a timer emits
        // nothing (the timer dispatch only lets a rule in force emit).
        let Some(counters) = self.counters else {
            return Ok(());
        };
        if let Some(suppressed) = &counters.shadow_suppressed {
            suppressed.inc();
            return Ok(());
        }
        counters.outputs.inc();
        counters.rule_outputs.inc();
        out.emit_written(rule.output_topic.as_deref(), key, |json| {
            record.write_json(json)
        })
    }
}

pub struct RuleEngine {
    options: EngineOptions,
    metrics: RuleMetrics,
    /// Rules in force, by id (iteration order = output order, deterministic).
    rules: BTreeMap<String, Live>,
    states: Option<States>,
}

/// A rule in force and its counters, fetched once when it is compiled.
struct Live {
    rule: Rule,
    counters: RuleCounters,
}

impl RuleEngine {
    /// The fixed keyed states `open` registers with this `[job] state_ttl` (dedup states,
    /// one per TTL, are named [`DEDUP_STATE_PREFIX`]`<ttl>ms` and created on demand).
    pub fn declared_states(
        state_ttl: Option<Duration>,
    ) -> Vec<streamstate_state::StateDeclaration> {
        Descriptors::new(state_ttl).declarations()
    }
}

/// The runtime's broadcast state of accepted rules (see `control.rs`).
fn rules_descriptor() -> MapStateDescriptor<String, StoredRule> {
    MapStateDescriptor::new("rules")
}

impl RuleEngine {
    pub fn new(config: &Config, metrics: Metrics) -> Self {
        let options = EngineOptions {
            event_time: config.job.timestamp.is_some(),
            state_ttl: config.job.state_ttl,
        };
        Self::with_options(options, metrics.registry())
    }

    pub fn with_options(options: EngineOptions, registry: &prometheus::Registry) -> Self {
        Self {
            options,
            metrics: RuleMetrics::new(registry),
            rules: BTreeMap::new(),
            states: None,
        }
    }

    /// Ids and versions of the rules in force.
    pub fn rules(&self) -> impl Iterator<Item = (&str, u64)> {
        self.rules
            .values()
            .map(|l| (l.rule.id.as_str(), l.rule.version))
    }

    pub fn metrics(&self) -> &RuleMetrics {
        &self.metrics
    }

    /// Puts `rule` in force under `id`, with its counters fetched once.
    fn install(&mut self, id: String, rule: Rule) {
        let counters = self.metrics.for_rule(&rule);
        self.rules.insert(id, Live { rule, counters });
    }
}

impl ProcessFunction for RuleEngine {
    fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
        self.states = Some(States::open(ctx, self.options.state_ttl)?);
        self.rules.clear();
        for (id, stored) in ctx.broadcast_state(&rules_descriptor()).entries()? {
            let Some(body) = stored.body else { continue };
            let compiled = serde_json::from_str::<Value>(&body)
                .map_err(|e| spec::RuleError::new(spec::reason::INVALID, e.to_string()))
                .and_then(|v| spec::compile(&v));
            match compiled {
                Ok(rule) => self.install(id, rule),
                // Accepted once, so only a language change can refuse it now: keep running
                // without it rather than stopping the job.
                Err(e) => {
                    tracing::error!(rule = %id, version = stored.version, reason = e.reason, error = %e, "stored rule no longer compiles; not in force")
                }
            }
        }
        Ok(())
    }

    fn process_element(
        &mut self,
        event: &Event<'_>,
        ctx: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let states = self.states.as_mut().ok_or(FunctionError::NotOpen)?;
        states.running.reset();
        states.windows.reset();
        for Live { rule, counters } in self.rules.values() {
            if rule.filter.as_ref().is_some_and(|f| !f.eval(event.value)) {
                continue;
            }
            counters.matches.inc();
            counters.rule_matches.inc();
            let env = Env {
                ctx,
                metrics: &self.metrics,
                counters: Some(counters),
                event_time: self.options.event_time,
            };
            match &rule.kind {
                Kind::Aggregate(a) => aggregate::on_event(&env, states, rule, a, event, out)?,
                Kind::Dedup(d) => dedup::on_event(&env, states, rule, d, event, out)?,
                Kind::Sequence(s) => sequence::on_event(&env, states, rule, s, event, out)?,
                Kind::Anomaly(a) => anomaly::on_event(&env, states, rule, a, event, out)?,
            }
        }
        let rules = &self.rules;
        let in_force = |id: &str, version| rules.get(id).is_some_and(|l| l.rule.version == version);
        states.running.finish(in_force)?;
        states.windows.finish(in_force)
    }

    /// The state the S-style rules read for every event: the key's running value (when
    /// a running, un-grouped aggregate matches) and each matching dedup rule's entry.
    /// Windows, groups, sequences and anomaly models are read as they are needed.
    fn prefetch(
        &mut self,
        events: &[Upcoming<'_>],
        ahead: &mut Prefetch,
    ) -> Result<(), FunctionError> {
        let states = self.states.as_mut().ok_or(FunctionError::NotOpen)?;
        for ev in events {
            let mut running = false;
            for Live { rule, .. } in self.rules.values() {
                if rule.filter.as_ref().is_some_and(|f| !f.eval(ev.value)) {
                    continue;
                }
                match &rule.kind {
                    Kind::Aggregate(a)
                        if a.window == spec::WindowSpec::Running && a.group_by.is_none() =>
                    {
                        running = true;
                    }
                    Kind::Dedup(d) => dedup::prefetch(states, rule, d, ev, ahead)?,
                    _ => {}
                }
            }
            if running {
                states.running.prefetch(ahead, ev.key)?;
            }
        }
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        update: &BroadcastUpdate<'_>,
        _: &BroadcastContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let Some(body) = update.body else {
            self.rules.remove(update.id);
            return Ok(());
        };
        match spec::compile(body) {
            Ok(rule) if rule.id != update.id || rule.version != update.version => out.reject(
                spec::reason::INVALID,
                format!(
                    "id/version in the body ({}, {}) differ from the record's ({}, {})",
                    rule.id, rule.version, update.id, update.version
                ),
            ),
            Ok(rule) => self.install(rule.id.clone(), rule),
            Err(e) => out.reject(
                e.reason,
                format!(
                    "rule {} version {}: {}",
                    update.id, update.version, e.message
                ),
            ),
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        timer: &FiredTimer<'_>,
        ctx: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let states = self.states.as_mut().ok_or(FunctionError::NotOpen)?;
        let Some(ns) = window::parse(timer.namespace) else {
            return Ok(());
        };
        let expected = if self.options.event_time {
            TimeDomain::EventTime
        } else {
            TimeDomain::ProcessingTime
        };
        if timer.domain != expected {
            return Ok(());
        }
        let key = String::from_utf8_lossy(timer.key);
        if ns.tag == window::WINDOW_END {
            return self.close_windows(ctx, &key, timer.timestamp_ms, out);
        }
        let live = self
            .rules
            .get(ns.id)
            .filter(|l| l.rule.version == ns.version);
        let env = Env {
            ctx,
            metrics: &self.metrics,
            counters: live.map(|l| &l.counters),
            event_time: self.options.event_time,
        };
        match (live.map(|l| (&l.rule, &l.rule.kind)), ns.tag) {
            (Some((rule, Kind::Aggregate(a))), window::WINDOW) => aggregate::on_window_timer(
                &env,
                states,
                rule,
                a,
                &key,
                ns.arg.unwrap_or(0),
                timer.timestamp_ms,
                out,
            ),
            (Some((rule, Kind::Aggregate(a))), window::SESSIONS) => {
                aggregate::on_session_timer(&env, states, rule, a, &key, timer.timestamp_ms, out)
            }
            (Some((rule, Kind::Sequence(s))), window::SEQUENCE) => {
                sequence::on_timer(&env, states, rule, s, &key, timer.timestamp_ms, out)
            }
            // The rule was deleted or replaced: its state is never read again; drop what the
            // timer scoped, emit nothing.
            (_, window::WINDOW) => {
                // Only state written before the combined value has timers here.
                states.win_acc.clear()?;
                states.win_groups.clear()?;
                Ok(states.win_distinct.clear()?)
            }
            (_, window::SESSIONS) => aggregate::drop_sessions(&env, states, timer.namespace),
            (_, window::SEQUENCE) => sequence::drop_state(states),
            _ => Ok(()),
        }
    }
}

impl RuleEngine {
    /// The un-grouped windows of `key` ending at the timer close (their value's namespace
    /// is current): each rule in force emits, in rule-id order; a deleted or replaced rule's
    /// entry is dropped with its distinct values.
    fn close_windows(
        &mut self,
        ctx: &KeyedContext<'_>,
        key: &str,
        timer_ms: u64,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let states = self.states.as_mut().ok_or(FunctionError::NotOpen)?;
        for e in states.windows.take()? {
            let live = self
                .rules
                .get(&e.rule)
                .filter(|l| l.rule.version == e.version);
            let env = Env {
                ctx,
                metrics: &self.metrics,
                counters: live.map(|l| &l.counters),
                event_time: self.options.event_time,
            };
            match live.map(|l| (&l.rule, &l.rule.kind)) {
                Some((rule, Kind::Aggregate(a))) => aggregate::close_window(
                    &env,
                    states,
                    rule,
                    a,
                    key,
                    e.start,
                    Some(e.acc),
                    timer_ms,
                    out,
                )?,
                _ if e.acc.distinct > 0 => {
                    env.set_namespace(&window::namespace(
                        &e.rule,
                        e.version,
                        window::WINDOW,
                        Some(e.start),
                    ));
                    states.win_distinct.clear()?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
