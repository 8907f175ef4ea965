//! The process-function API: the Rust twin of Flink's `KeyedBroadcastProcessFunction`.
//!
//! A job is one [`ProcessFunction`]. The runtime owns everything that makes it exactly
//! once — Kafka, offsets, transactions, checkpoints, recovery — and calls the function
//! with one input at a time. The function only sees:
//!
//! - events (decoded JSON, keyed; keyed state is scoped to the event's key),
//! - control-topic updates (versioned by the runtime; the function may refuse them),
//! - timers it registered (event time, closed by the watermark, or processing time),
//!
//! and writes output through [`Output`]. Capabilities follow Flink's split and are
//! enforced by types: the keyed side ([`KeyedContext`]) reads broadcast state and owns
//! timers; the broadcast side ([`BroadcastContext`]) writes broadcast state and cannot
//! touch keyed state.
//!
//! Everything a function keeps must be in state obtained in [`ProcessFunction::open`]:
//! after a crash or an aborted epoch the runtime restores the last checkpoint and calls
//! `open` again, so in-memory fields must be rebuilt there, never carried over.
//!
//! ```
//! use streamstate::function::*;
//! use streamstate_state::{ValueState, ValueStateDescriptor};
//!
//! /// Emits the running number of events per key.
//! #[derive(Default)]
//! struct Count {
//!     count: Option<ValueState<u64>>,
//! }
//!
//! impl ProcessFunction for Count {
//!     fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
//!         self.count = Some(ctx.value_state(&ValueStateDescriptor::new("count"))?);
//!         Ok(())
//!     }
//!     fn process_element(&mut self, event: &Event<'_>, _: &KeyedContext<'_>, out: &mut Output) -> Result<(), FunctionError> {
//!         let count = self.count.as_ref().ok_or(FunctionError::NotOpen)?;
//!         let n = count.value()?.unwrap_or(0) + 1;
//!         count.update(&n)?;
//!         out.emit(event.key, &serde_json::json!({"key": event.key, "count": n}))
//!     }
//! }
//! ```

use serde::Serialize;
use serde_json::Value;
use streamstate_state::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, BroadcastState, ListState,
    ListStateDescriptor, MapState, MapStateDescriptor, OperatorListState, Prefetch,
    ReadOnlyBroadcastState, ReducingState, ReducingStateDescriptor, StateError, StateStore,
    StateValue, TimeDomain, ValueState, ValueStateDescriptor,
};

/// Where an input record came from. Outputs caused by one event name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceRef {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// One decoded input record. Keyed state is already scoped to `key`.
#[derive(Debug)]
pub struct Event<'a> {
    pub key: &'a str,
    pub value: &'a Value,
    /// Event time in ms since the epoch when `[job] timestamp` names a field; the
    /// processing time of the record otherwise.
    pub timestamp_ms: u64,
    pub source: &'a SourceRef,
}

/// An event of the batch about to be processed, as [`ProcessFunction::prefetch`] sees it
/// (before the runtime checks its time or key group).
#[derive(Debug, Clone, Copy)]
pub struct Upcoming<'a> {
    pub key: &'a str,
    pub value: &'a Value,
}

/// A control-topic record the runtime accepted as newer than the version in force.
#[derive(Debug)]
pub struct BroadcastUpdate<'a> {
    /// The record key.
    pub id: &'a str,
    pub version: u64,
    /// The parsed record value; `None` when the update deletes `id` (a tombstone or
    /// `"status": "deleted"`).
    pub body: Option<&'a Value>,
    pub source: &'a SourceRef,
}

/// A timer that came due, with keyed state scoped to its key and namespace.
#[derive(Debug)]
pub struct FiredTimer<'a> {
    pub timestamp_ms: u64,
    pub domain: TimeDomain,
    pub key: &'a [u8],
    pub namespace: &'a [u8],
}

#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error("state: {0}")]
    State(#[from] StateError),
    #[error("output value cannot be encoded as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("function used before open()")]
    NotOpen,
    #[error("{0}")]
    Other(String),
}

/// A user function. Only `open` and `process_element` are required.
pub trait ProcessFunction: Send {
    /// Called before any input and again after every restore (start, or an aborted
    /// epoch rewound to the last checkpoint): obtain state handles, rebuild caches.
    fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError>;

    /// One event. Keyed state and timers are scoped to `event.key`.
    fn process_element(
        &mut self,
        event: &Event<'_>,
        ctx: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError>;

    /// The runtime polls records in batches. Before it processes a batch, a function
    /// may name the keyed state its events will read (with the handles' `prefetch`
    /// methods, the key being [`Upcoming::key`]), and a backend that reads batches
    /// faster (RocksDB: one MultiGet) fetches it all at once. Optional and only a
    /// hint: what is not named is read when asked for, and what is named but not read
    /// costs one lookup.
    fn prefetch(
        &mut self,
        events: &[Upcoming<'_>],
        ahead: &mut Prefetch,
    ) -> Result<(), FunctionError> {
        let _ = (events, ahead);
        Ok(())
    }

    /// A newer version of a control-topic entry (or its deletion). Calling
    /// [`Output::reject`] refuses it: the runtime then keeps the previous version in
    /// force, and the record goes to the dead-letter topic with the reason. Accepting
    /// is the default.
    fn process_broadcast_element(
        &mut self,
        update: &BroadcastUpdate<'_>,
        ctx: &BroadcastContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let _ = (update, ctx, out);
        Ok(())
    }

    /// A timer this function registered came due.
    fn on_timer(
        &mut self,
        timer: &FiredTimer<'_>,
        ctx: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let _ = (timer, ctx, out);
        Ok(())
    }

    /// Called at each checkpoint before state is snapshotted: move in-memory buffers
    /// into operator state (Flink's `CheckpointedFunction::snapshotState`).
    fn snapshot_state(&mut self, checkpoint_id: u64) -> Result<(), FunctionError> {
        let _ = checkpoint_id;
        Ok(())
    }
}

/// Given to [`ProcessFunction::open`]: typed state handles.
pub struct OpenContext<'a> {
    pub(crate) store: &'a StateStore,
}

impl<'a> OpenContext<'a> {
    pub fn new(store: &'a StateStore) -> Self {
        Self { store }
    }
    /// True when state came from a checkpoint or savepoint (Flink's `isRestored`).
    pub fn is_restored(&self) -> bool {
        self.store.is_restored()
    }
    pub fn processing_time_ms(&self) -> u64 {
        self.store.now_ms()
    }
    pub fn value_state<T: StateValue + Clone>(
        &self,
        d: &ValueStateDescriptor<T>,
    ) -> Result<ValueState<T>, FunctionError> {
        Ok(self.store.value_state(d)?)
    }
    pub fn list_state<T: StateValue>(
        &self,
        d: &ListStateDescriptor<T>,
    ) -> Result<ListState<T>, FunctionError> {
        Ok(self.store.list_state(d)?)
    }
    pub fn map_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> Result<MapState<K, V>, FunctionError> {
        Ok(self.store.map_state(d)?)
    }
    pub fn reducing_state<T: StateValue>(
        &self,
        d: &ReducingStateDescriptor<T>,
    ) -> Result<ReducingState<T>, FunctionError> {
        Ok(self.store.reducing_state(d)?)
    }
    pub fn aggregating_state<F>(
        &self,
        d: &AggregatingStateDescriptor<F>,
    ) -> Result<AggregatingState<F>, FunctionError>
    where
        F: AggregateFunction,
        F::Acc: StateValue,
    {
        Ok(self.store.aggregating_state(d)?)
    }
    /// Operator list state: split evenly across instances on rescale.
    pub fn operator_list_state<T: StateValue>(
        &self,
        name: &str,
    ) -> Result<OperatorListState<T>, FunctionError> {
        Ok(self.store.operator_list_state(name)?)
    }
    /// Union list state: every instance gets the whole list on rescale.
    pub fn union_list_state<T: StateValue>(
        &self,
        name: &str,
    ) -> Result<OperatorListState<T>, FunctionError> {
        Ok(self.store.union_list_state(name)?)
    }
    /// Broadcast state, read-only (the keyed side's view; for rebuilding caches).
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> ReadOnlyBroadcastState<K, V> {
        self.store.read_only_broadcast_state(d)
    }
}

/// Given to `process_element` and `on_timer`: the current key's scope, timers, time, and
/// read-only broadcast state.
pub struct KeyedContext<'a> {
    store: &'a StateStore,
    timestamp_ms: u64,
    watermark_ms: Option<u64>,
}

impl<'a> KeyedContext<'a> {
    pub fn new(store: &'a StateStore, timestamp_ms: u64, watermark_ms: Option<u64>) -> Self {
        Self {
            store,
            timestamp_ms,
            watermark_ms,
        }
    }
    /// The event's timestamp (or the timer's).
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    /// Event time up to which all input has been seen (minus the allowed
    /// out-of-orderness); `None` before any event with a timestamp.
    pub fn current_watermark_ms(&self) -> Option<u64> {
        self.watermark_ms
    }
    pub fn processing_time_ms(&self) -> u64 {
        self.store.now_ms()
    }
    pub fn current_key(&self) -> Option<Vec<u8>> {
        self.store.current_key()
    }
    /// Scopes keyed state and timers to a namespace (a window, a rule) until changed;
    /// the empty namespace is the default, restored before every call.
    pub fn set_namespace(&self, namespace: &[u8]) {
        self.store.set_current_namespace(namespace);
    }
    pub fn register_event_time_timer(&self, ts_ms: u64) -> Result<(), FunctionError> {
        Ok(self.store.register_event_time_timer(ts_ms)?)
    }
    pub fn delete_event_time_timer(&self, ts_ms: u64) -> Result<(), FunctionError> {
        Ok(self.store.delete_event_time_timer(ts_ms)?)
    }
    pub fn register_processing_time_timer(&self, ts_ms: u64) -> Result<(), FunctionError> {
        Ok(self.store.register_processing_time_timer(ts_ms)?)
    }
    pub fn delete_processing_time_timer(&self, ts_ms: u64) -> Result<(), FunctionError> {
        Ok(self.store.delete_processing_time_timer(ts_ms)?)
    }
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> ReadOnlyBroadcastState<K, V> {
        self.store.read_only_broadcast_state(d)
    }
}

/// Given to `process_broadcast_element`: writable broadcast state, no keyed state.
pub struct BroadcastContext<'a> {
    store: &'a StateStore,
}

impl<'a> BroadcastContext<'a> {
    pub fn new(store: &'a StateStore) -> Self {
        Self { store }
    }
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> BroadcastState<K, V> {
        self.store.broadcast_state(d)
    }
    pub fn processing_time_ms(&self) -> u64 {
        self.store.now_ms()
    }
}

/// One output record. `topic: None` means `[kafka] output_topic`.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputRecord {
    pub topic: Option<String>,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// Why the input at hand goes to the dead-letter topic instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// Short fixed label: the metric label and `streamstate.error.reason` header.
    pub reason: &'static str,
    pub message: String,
}

/// What a call produced. The runtime sends records into the epoch's transaction in
/// order, so they are committed exactly when the input's offset is.
#[derive(Debug, Default)]
pub struct Output {
    records: Vec<OutputRecord>,
    rejection: Option<Rejection>,
    /// The last JSON record's length. A function's records are alike in size, so the
    /// next one's buffer starts there rather than growing from a few bytes by doubling
    /// (about six reallocations for a 300-byte record, a visible share of S-EO's malloc).
    last_len: usize,
}

impl Output {
    /// A JSON record to `[kafka] output_topic`, keyed by `key`.
    pub fn emit(&mut self, key: &str, value: &impl Serialize) -> Result<(), FunctionError> {
        self.emit_to(None, key, value)
    }

    /// A JSON record to `topic` (or the output topic).
    pub fn emit_to(
        &mut self,
        topic: Option<&str>,
        key: &str,
        value: &impl Serialize,
    ) -> Result<(), FunctionError> {
        self.emit_written(topic, key, |json| serde_json::to_writer(json, value))
    }

    /// A JSON record that `write` appends to an empty buffer, for values that write their
    /// own JSON faster than `Serialize` does (the rule engine's outputs).
    pub fn emit_written(
        &mut self,
        topic: Option<&str>,
        key: &str,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>,
    ) -> Result<(), FunctionError> {
        // Some slack: the next record is often a few bytes longer (a bigger count).
        let mut json = Vec::with_capacity(self.last_len + 64);
        write(&mut json)?;
        self.last_len = json.len();
        self.records.push(OutputRecord {
            topic: topic.map(str::to_string),
            key: Some(key.as_bytes().to_vec()),
            value: json,
        });
        Ok(())
    }

    /// Raw bytes, for functions that do their own encoding.
    pub fn emit_bytes(&mut self, topic: Option<&str>, key: Option<&[u8]>, value: &[u8]) {
        self.records.push(OutputRecord {
            topic: topic.map(str::to_string),
            key: key.map(<[u8]>::to_vec),
            value: value.to_vec(),
        });
    }

    /// Sends the input (event or control record) to the dead-letter topic with `reason`.
    /// For a control update it also means: keep the version in force.
    pub fn reject(&mut self, reason: &'static str, message: impl Into<String>) {
        self.rejection = Some(Rejection {
            reason,
            message: message.into(),
        });
    }

    pub fn records(&self) -> &[OutputRecord] {
        &self.records
    }

    pub fn rejection(&self) -> Option<&Rejection> {
        self.rejection.as_ref()
    }

    /// Empties the buffer for the next call, returning what it held.
    pub fn take(&mut self) -> (Vec<OutputRecord>, Option<Rejection>) {
        (std::mem::take(&mut self.records), self.rejection.take())
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.rejection.is_none()
    }
}
