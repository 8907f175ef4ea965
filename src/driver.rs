//! Runs one [`ProcessFunction`] over one [`StateStore`]: scopes state to each input's key,
//! tracks event time, fires timers, and reopens the function after every restore.
//!
//! The job loop owns Kafka and the commit protocol and hands inputs here; unit tests
//! drive the same code with a manual clock (see [`Driver::with_clock`]), so a function
//! behaves identically under test and in production.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use streamstate_state::{
    DeferredSnapshot, OperatorListState, SnapshotResult, StateStore, TimeDomain,
};

use crate::function::{
    BroadcastContext, BroadcastUpdate, Event, FiredTimer, FunctionError, KeyedContext, OpenContext,
    Output, OutputRecord, ProcessFunction, Rejection, SourceRef, Upcoming,
};

/// Operator state holding each partition's highest event time, so the watermark after a
/// restore is the one the checkpoint saw (a replay must classify late events the same way).
const WATERMARKS: &str = "streamstate.watermarks";

/// Where the watermark itself is kept among the per-partition entries.
const WATERMARK_ENTRY: (String, i32) = (String::new(), -1);

/// The reason label for events whose key another instance owns.
pub const KEY_NOT_OWNED: &str = "key_not_owned";

/// The reason label for events older than the watermark.
pub const LATE_EVENT: &str = "late_event";

/// How event time works for this job (`[job] timestamp` and `max_out_of_orderness`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EventTime {
    /// Events carry a timestamp field; windows and sequences close on the watermark.
    pub enabled: bool,
    pub max_out_of_orderness: Duration,
    /// A partition without events for this long (processing time) stops holding the
    /// watermark back until it delivers again (Flink's `withIdleness`). `None`: never.
    pub idle_timeout: Option<Duration>,
}

/// What one input produced: records for the transaction, or a reason to dead-letter it.
pub type Produced = (Vec<OutputRecord>, Option<Rejection>);

pub struct Driver {
    store: StateStore,
    function: Box<dyn ProcessFunction>,
    event_time: EventTime,
    /// Highest event time seen per input partition.
    max_seen: BTreeMap<(String, i32), u64>,
    /// The input partitions this instance reads; each one holds the watermark back until
    /// it has delivered an event. Empty: every partition seen so far counts.
    partitions: Vec<(String, i32)>,
    /// Processing time of each partition's last event, for idleness.
    last_event_at: BTreeMap<(String, i32), u64>,
    /// The highest watermark so far.
    watermark: Option<u64>,
    watermark_state: OperatorListState<(String, i32, u64)>,
    out: Output,
    /// Timers fired since start: a checkpoint barrier with no new input and no fired
    /// timer has nothing new to commit.
    timers_fired: u64,
}

impl Driver {
    /// Opens `function` on `store` (empty or already restored).
    pub fn new(
        store: StateStore,
        function: Box<dyn ProcessFunction>,
        event_time: EventTime,
    ) -> Result<Self, FunctionError> {
        let watermark_state = store.union_list_state(WATERMARKS)?;
        let mut driver = Self {
            store,
            function,
            event_time,
            max_seen: BTreeMap::new(),
            partitions: Vec::new(),
            last_event_at: BTreeMap::new(),
            watermark: None,
            watermark_state,
            out: Output::default(),
            timers_fired: 0,
        };
        driver.open()?;
        Ok(driver)
    }

    pub fn store(&self) -> &StateStore {
        &self.store
    }

    /// Replaces all state with a checkpoint's files (`None`: empty state) and reopens the
    /// function. The state layer verifies every file before it swaps anything in.
    pub fn reset(&mut self, from: Option<(PathBuf, SnapshotResult)>) -> Result<(), FunctionError> {
        self.store.restore(from.as_slice())?;
        self.open()
    }

    fn open(&mut self) -> Result<(), FunctionError> {
        self.max_seen = self
            .watermark_state
            .get()?
            .into_iter()
            .map(|(t, p, ts)| ((t, p), ts))
            .collect();
        self.watermark = self.max_seen.remove(&WATERMARK_ENTRY);
        self.last_event_at.clear();
        self.store.set_current_namespace(&[]);
        self.function.open(&OpenContext::new(&self.store))
    }

    /// The input partitions whose event time makes the watermark (Flink's per-split
    /// watermarks): the slowest one decides, and one that has delivered nothing yet
    /// holds the watermark back, so no event is classified late only because its
    /// partition was fetched after another.
    pub fn set_partitions(&mut self, partitions: impl IntoIterator<Item = (String, i32)>) {
        self.partitions = partitions.into_iter().collect();
    }

    /// Event time below which input is complete; `None` in processing-time mode or
    /// before every partition has delivered an event. Never goes back, also when an
    /// idle partition resumes: its older events are then late, not a reason to reopen
    /// windows that already closed.
    pub fn watermark_ms(&mut self) -> Option<u64> {
        let computed = self.computed_watermark();
        self.watermark = self.watermark.max(computed);
        self.watermark
    }

    fn computed_watermark(&self) -> Option<u64> {
        if !self.event_time.enabled {
            return None;
        }
        let idle_since = self
            .event_time
            .idle_timeout
            .map(|t| self.store.now_ms().saturating_sub(t.as_millis() as u64));
        // Idle only after having been seen in this run: a partition restored from a
        // checkpoint gets a full timeout to deliver before it stops counting.
        let idle = |p: &(String, i32)| {
            idle_since.is_some_and(|since| self.last_event_at.get(p).is_some_and(|at| *at < since))
        };
        let min = if self.partitions.is_empty() {
            *self.max_seen.values().min()?
        } else {
            let mut min = None::<u64>;
            for p in self.partitions.iter().filter(|p| !idle(p)) {
                let seen = *self.max_seen.get(p)?;
                min = Some(min.map_or(seen, |m| m.min(seen)));
            }
            // Every partition idle: the watermark stays where the active ones left it.
            match min {
                Some(m) => m,
                None => *self.max_seen.values().max()?,
            }
        };
        Some(min.saturating_sub(self.event_time.max_out_of_orderness.as_millis() as u64))
    }

    /// One event. In event-time mode `timestamp_ms` is required (the decoder refuses
    /// events without one) and an event older than the watermark is rejected as late.
    pub fn element(
        &mut self,
        key: &str,
        value: &Value,
        timestamp_ms: Option<u64>,
        source: &SourceRef,
    ) -> Result<Produced, FunctionError> {
        self.element_from(
            (&source.topic, source.partition),
            key,
            value,
            timestamp_ms,
            source,
        )
    }

    /// [`Driver::element`] for an event read from `read_from`, which is not where it was
    /// first written (`source`): in repartition mode the partition that makes the
    /// watermark is the internal topic's partition this instance reads.
    pub fn element_from(
        &mut self,
        read_from: (&str, i32),
        key: &str,
        value: &Value,
        timestamp_ms: Option<u64>,
        source: &SourceRef,
    ) -> Result<Produced, FunctionError> {
        let watermark = self.watermark_ms();
        let timestamp_ms = match timestamp_ms {
            Some(ts) if self.event_time.enabled => {
                if let Some(w) = watermark.filter(|w| ts < *w) {
                    self.out.reject(
                        LATE_EVENT,
                        format!("event time {ts} ms is older than the watermark {w} ms"),
                    );
                    return Ok(self.out.take());
                }
                ts
            }
            _ => self.store.now_ms(),
        };
        let key_group = self.store.key_group_of(key.as_bytes());
        if !self.store.key_group_range().contains(key_group) {
            // Only with several instances: the producer did not partition by this key.
            self.out.reject(
                KEY_NOT_OWNED,
                format!(
                    "key group {key_group} of this key belongs to another instance (this one owns {}); \
                     partition the input by the state key, or use job.repartition",
                    self.store.key_group_range()
                ),
            );
            return Ok(self.out.take());
        }
        self.store.set_current_key(key.as_bytes())?;
        self.store.set_current_namespace(&[]);
        let event = Event {
            key,
            value,
            timestamp_ms,
            source,
        };
        let result = self.function.process_element(
            &event,
            &KeyedContext::new(&self.store, timestamp_ms, watermark),
            &mut self.out,
        );
        self.store.set_current_namespace(&[]);
        result?;
        if self.event_time.enabled {
            let partition = (read_from.0.to_string(), read_from.1);
            if self.event_time.idle_timeout.is_some() {
                self.last_event_at
                    .insert(partition.clone(), self.store.now_ms());
            }
            let seen = self.max_seen.entry(partition).or_insert(timestamp_ms);
            *seen = (*seen).max(timestamp_ms);
        }
        Ok(self.out.take())
    }

    /// Starts a batch of input records: the function names the state `events` will
    /// read and the store fetches it together ([`streamstate_state::batch`]). End it
    /// with [`Driver::end_batch`].
    pub fn begin_batch(&mut self, events: &[Upcoming<'_>]) -> Result<(), FunctionError> {
        self.store.begin_batch()?;
        if events.is_empty() || !self.store.reads_ahead() {
            return Ok(());
        }
        let mut ahead = self.store.prefetch_list();
        self.function.prefetch(events, &mut ahead)?;
        Ok(self.store.prefetch(ahead)?)
    }

    /// Ends the batch: its held state writes reach the backend (their error, if
    /// any, is returned) and what was read ahead is dropped. Call it however the
    /// batch ended.
    pub fn end_batch(&mut self) -> Result<(), FunctionError> {
        Ok(self.store.end_batch()?)
    }

    /// A control update already found newer than the version in force. A rejection
    /// means the function refused it; the caller keeps the old version.
    pub fn broadcast(&mut self, update: &BroadcastUpdate<'_>) -> Result<Produced, FunctionError> {
        self.function.process_broadcast_element(
            update,
            &BroadcastContext::new(&self.store),
            &mut self.out,
        )?;
        Ok(self.out.take())
    }

    /// Fires processing-time timers up to now and event-time timers up to the watermark,
    /// in time order. Cheap when nothing is due.
    pub fn fire_timers(&mut self) -> Result<Vec<OutputRecord>, FunctionError> {
        let mut records = Vec::new();
        let now = self.store.now_ms();
        let watermark = self.watermark_ms();
        let due = |d: &Self, domain, up_to: Option<u64>| {
            up_to.is_some_and(|t| d.store.next_timer(domain).is_some_and(|n| n <= t))
        };
        for (domain, up_to) in [
            (TimeDomain::ProcessingTime, Some(now)),
            (TimeDomain::EventTime, watermark),
        ] {
            // A timer may register another timer that is already due; loop until none is.
            while due(self, domain, up_to) {
                let Some(up_to) = up_to else { break };
                for timer in self.store.pop_due_timers(domain, up_to)? {
                    self.store.set_current_key(&timer.key)?;
                    self.store.set_current_namespace(&timer.namespace);
                    let fired = FiredTimer {
                        timestamp_ms: timer.timestamp,
                        domain,
                        key: &timer.key,
                        namespace: &timer.namespace,
                    };
                    let ctx = KeyedContext::new(&self.store, timer.timestamp, watermark);
                    self.timers_fired += 1;
                    let result = self.function.on_timer(&fired, &ctx, &mut self.out);
                    self.store.set_current_namespace(&[]);
                    result?;
                    let (produced, rejection) = self.out.take();
                    if let Some(r) = rejection {
                        tracing::warn!(reason = r.reason, message = %r.message, "a timer cannot reject an input; ignored");
                    }
                    records.extend(produced);
                }
            }
        }
        Ok(records)
    }

    /// Timers fired since this driver was created.
    pub fn timers_fired(&self) -> u64 {
        self.timers_fired
    }

    /// The function's own snapshot hook, then the store's snapshot into `dir`.
    pub fn snapshot(
        &mut self,
        checkpoint_id: u64,
        dir: &Path,
    ) -> Result<SnapshotResult, FunctionError> {
        self.prepare_snapshot(checkpoint_id)?;
        Ok(self.store.snapshot(checkpoint_id, dir)?)
    }

    /// [`Driver::snapshot`] for the checkpoint barrier: the RocksDB flush and links and
    /// the hashes of new SST files are left to the returned part, for the uploader to
    /// complete off the job thread ([`StateStore::snapshot_deferred`]).
    pub fn snapshot_deferred(
        &mut self,
        checkpoint_id: u64,
        dir: &Path,
    ) -> Result<(SnapshotResult, Option<DeferredSnapshot>), FunctionError> {
        self.prepare_snapshot(checkpoint_id)?;
        Ok(self.store.snapshot_deferred(checkpoint_id, dir)?)
    }

    fn prepare_snapshot(&mut self, checkpoint_id: u64) -> Result<(), FunctionError> {
        self.function.snapshot_state(checkpoint_id)?;
        let mut marks: Vec<(String, i32, u64)> = self
            .max_seen
            .iter()
            .map(|((t, p), ts)| (t.clone(), *p, *ts))
            .collect();
        if let Some(w) = self.watermark {
            marks.push((WATERMARK_ENTRY.0.to_string(), WATERMARK_ENTRY.1, w));
        }
        self.watermark_state.update(&marks)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use streamstate_state::{
        BackendKind, ManualClock, StoreConfig, ValueState, ValueStateDescriptor,
    };

    use super::*;

    /// Sums `/n` per key and emits the sum when an event-time timer at `ts + 10` fires.
    #[derive(Default)]
    struct DelayedSum {
        sum: Option<ValueState<u64>>,
        opened: u32,
    }

    impl ProcessFunction for DelayedSum {
        fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
            self.sum = Some(ctx.value_state(&ValueStateDescriptor::new("sum"))?);
            self.opened += 1;
            Ok(())
        }
        fn process_element(
            &mut self,
            e: &Event<'_>,
            ctx: &KeyedContext<'_>,
            _: &mut Output,
        ) -> Result<(), FunctionError> {
            let sum = self.sum.as_ref().ok_or(FunctionError::NotOpen)?;
            sum.update(&(sum.value()?.unwrap_or(0) + e.value["n"].as_u64().unwrap_or(0)))?;
            ctx.register_event_time_timer(e.timestamp_ms + 10)
        }
        fn on_timer(
            &mut self,
            t: &FiredTimer<'_>,
            _: &KeyedContext<'_>,
            out: &mut Output,
        ) -> Result<(), FunctionError> {
            let sum = self.sum.as_ref().ok_or(FunctionError::NotOpen)?;
            let key = String::from_utf8_lossy(t.key).to_string();
            out.emit(
                &key,
                &json!({"key": key, "sum": sum.value()?, "at": t.timestamp_ms}),
            )
        }
    }

    fn driver(dir: &Path) -> Driver {
        driver_with_clock(dir, ManualClock::new(1_000), None)
    }

    fn driver_with_clock(dir: &Path, clock: ManualClock, idle_timeout: Option<Duration>) -> Driver {
        let store = StateStore::open_with_clock(
            StoreConfig::new(BackendKind::Hashmap, dir, 4),
            Arc::new(clock),
        )
        .expect("store");
        let time = EventTime {
            enabled: true,
            max_out_of_orderness: Duration::from_millis(5),
            idle_timeout,
        };
        Driver::new(store, Box::new(DelayedSum::default()), time).expect("driver")
    }

    #[test]
    fn an_idle_partition_stops_holding_the_watermark_back_after_the_timeout() {
        let dir = tempfile::tempdir().expect("dir");
        let clock = ManualClock::new(1_000);
        let mut d = driver_with_clock(dir.path(), clock.clone(), Some(Duration::from_secs(10)));
        d.set_partitions([("in".to_string(), 0), ("in".to_string(), 1)]);
        d.element("a", &json!({"n": 1}), Some(100), &src(0, 0))
            .expect("element");
        d.element("b", &json!({"n": 1}), Some(500), &src(1, 0))
            .expect("element");
        assert_eq!(d.watermark_ms(), Some(95));
        clock.advance(9_000);
        d.element("b", &json!({"n": 1}), Some(900), &src(1, 1))
            .expect("element");
        assert_eq!(d.watermark_ms(), Some(95), "partition 0 is not idle yet");
        clock.advance(2_000);
        assert_eq!(
            d.watermark_ms(),
            Some(895),
            "partition 0 idle for 11 s: partition 1 alone decides"
        );
        let (_, late) = d
            .element("a", &json!({"n": 1}), Some(120), &src(0, 1))
            .expect("element");
        assert_eq!(
            late.map(|r| r.reason),
            Some(LATE_EVENT),
            "the resumed partition's old event is late"
        );
        d.element("a", &json!({"n": 1}), Some(897), &src(0, 2))
            .expect("element");
        assert_eq!(d.watermark_ms(), Some(895), "the watermark never goes back");
    }

    fn src(partition: i32, offset: i64) -> SourceRef {
        SourceRef {
            topic: "in".into(),
            partition,
            offset,
        }
    }

    #[test]
    fn watermark_is_the_slowest_partition_minus_out_of_orderness_and_fires_timers() {
        let dir = tempfile::tempdir().expect("dir");
        let mut d = driver(dir.path());
        d.set_partitions([("in".to_string(), 0), ("in".to_string(), 1)]);
        assert_eq!(d.watermark_ms(), None);
        d.element("a", &json!({"n": 2}), Some(100), &src(0, 0))
            .expect("element");
        d.element("a", &json!({"n": 3}), Some(104), &src(0, 1))
            .expect("element");
        assert_eq!(
            d.watermark_ms(),
            None,
            "partition 1 has delivered nothing yet"
        );
        d.element("b", &json!({"n": 1}), Some(200), &src(1, 0))
            .expect("element");
        assert_eq!(
            d.watermark_ms(),
            Some(99),
            "partition 0 holds the watermark back"
        );
        assert!(d.fire_timers().expect("fire").is_empty());
        d.element("a", &json!({"n": 0}), Some(150), &src(0, 2))
            .expect("element");
        let fired = d.fire_timers().expect("fire");
        // Timers at 110 and 114 (key a) are due at watermark 145; 160 (a) and 210 (b) are not.
        let values: Vec<Value> = fired
            .iter()
            .map(|r| serde_json::from_slice(&r.value).expect("json"))
            .collect();
        assert_eq!(
            values,
            vec![
                json!({"key": "a", "sum": 5, "at": 110}),
                json!({"key": "a", "sum": 5, "at": 114})
            ]
        );
    }

    #[test]
    fn late_events_are_rejected_without_reaching_the_function() {
        let dir = tempfile::tempdir().expect("dir");
        let mut d = driver(dir.path());
        d.element("a", &json!({"n": 1}), Some(100), &src(0, 0))
            .expect("element");
        let (records, rejection) = d
            .element("a", &json!({"n": 50}), Some(90), &src(0, 1))
            .expect("element");
        assert!(records.is_empty());
        assert_eq!(rejection.map(|r| r.reason), Some(LATE_EVENT));
        let (_, ok) = d
            .element("a", &json!({"n": 1}), Some(95), &src(0, 2))
            .expect("element");
        assert_eq!(ok, None, "within max_out_of_orderness is on time");
    }

    #[test]
    fn restore_brings_back_the_watermark_and_reopens_the_function() {
        let dir = tempfile::tempdir().expect("dir");
        let mut d = driver(dir.path());
        d.element("a", &json!({"n": 1}), Some(100), &src(0, 0))
            .expect("element");
        let snap = d.snapshot(1, &dir.path().join("snap")).expect("snapshot");
        d.element("a", &json!({"n": 1}), Some(500), &src(0, 1))
            .expect("element");
        assert_eq!(d.watermark_ms(), Some(495));
        d.reset(Some((dir.path().join("snap"), snap)))
            .expect("reset");
        assert_eq!(d.watermark_ms(), Some(95));
        let fired = d.fire_timers().expect("fire");
        assert!(
            fired.is_empty(),
            "the timer at 110 is still pending at watermark 95"
        );
        d.element("a", &json!({"n": 1}), Some(120), &src(0, 1))
            .expect("element");
        let fired = d.fire_timers().expect("fire");
        let v: Value = serde_json::from_slice(&fired[0].value).expect("json");
        assert_eq!(
            v,
            json!({"key": "a", "sum": 2, "at": 110}),
            "state and timers as of the checkpoint"
        );
    }
}
