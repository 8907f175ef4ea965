//! streamstate: a stateful, exactly-once stream job over Kafka with Apache Flink's state
//! model, in one binary and without a Flink cluster.
//!
//! # Layout
//!
//! Data flows one way, and the modules follow it:
//!
//! - [`config`]: the TOML file and `STREAMSTATE__SECTION__KEY` overrides; refuses unknown keys.
//! - [`source`]: the Kafka consumer with manual assignment; offsets are the service's own.
//! - [`decode`]: bytes → JSON event + state key, or a reason for the dead-letter topic;
//!   [`format`] reads Avro and Protobuf (Confluent wire format, Schema Registry) and
//!   writes Avro outputs.
//! - [`function`]: the process-function API (Flink's `KeyedBroadcastProcessFunction`);
//!   [`functions`] holds the built-in ones, [`rules`] the rule engine (itself a function).
//! - [`driver`]: runs one function over the state store: key scope, event time, timers.
//! - [`control`]: control-topic records → versioned updates, kept in broadcast state.
//! - [`sink`]: the pool of transactional producers, one transaction per checkpoint epoch;
//!   [`transactions`] what operators see of the open transaction (age, checkpoint).
//! - [`kafka_client`]: the librdkafka settings each client role starts from (the user's
//!   shared properties, then the role's own table).
//! - [`kafka_log`]: librdkafka's logs and errors into `tracing`, once per distinct message.
//! - [`checkpoint`]: checkpoint storage and manifests (verify before restore).
//! - [`commit`]: the commit protocol: pipelined epochs over a pool of transactional
//!   producers, uploaded and committed in epoch order by a committer thread.
//! - [`job`]: the loop that ties them together: start-up and restore, record routing,
//!   the checkpoint barrier, admin requests.
//! - [`requests`]: the bounded channel from the admin server to the job loop.
//! - [`history`]: checkpoints and savepoints the loop took, as the admin API shows them.
//! - [`savepoint`]: savepoint locations, ids and listing (written by the job loop).
//! - [`cluster`] and [`rescale`]: which partitions and key groups instance `i` of `N` owns;
//!   savepoint sets and the restore of a new range from them (N → M).
//! - [`repartition`]: input not partitioned by the state key goes through an internal topic
//!   keyed by it; both hops commit in the epoch's transaction.
//! - [`admin`] and [`metrics`]: what operators see (HTTP endpoints, Prometheus).
//! - [`tools`]: offline checkpoint tools (list, inspect, verify, export/import, surgery,
//!   check-restore) on checkpoint storage, never on a running instance.
//! - [`service`]: one instance: admin server, job thread, signals; [`service::run`] is the
//!   entry point for binaries with their own process function.
//!
//! # The commit protocol
//!
//! Epoch `e` produces into transaction `T_e`; at a checkpoint barrier the loop takes a
//! local snapshot, opens `T_{e+1}` on another producer of the pool and goes on, while the
//! committer thread writes `chk-e` durably, sends the source offsets (metadata naming
//! `chk-e`) into `T_e` and commits, in epoch order. That commit is the single decision
//! point; recovery restores whichever checkpoint the group's committed offsets name. See
//! [`commit`] and `../shared/DESIGN.md`.

/// Crashes the process here when a test configured this failpoint (feature `failpoints`,
/// `FAILPOINTS=<name>=return`); compiles to nothing otherwise.
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| $crate::failpoint_crash($name))
    };
}
pub(crate) use crash_point;

/// The state layer (descriptors, handles, TTL), re-exported for process functions.
pub use streamstate_state as state;

pub mod admin;
pub mod checkpoint;
pub mod cluster;
pub mod commit;
pub mod config;
pub mod control;
pub mod decode;
pub mod driver;
pub mod format;
pub mod function;
pub mod functions;
pub mod history;
pub mod job;
pub mod kafka_client;
pub mod kafka_log;
pub mod metrics;
pub mod repartition;
pub mod requests;
pub mod rescale;
pub mod rules;
pub mod savepoint;
pub mod service;
pub mod sink;
pub mod source;
pub mod tools;
pub mod transactions;

/// What a configured failpoint does: die on the spot, like `kill -9`, leaving files and
/// the open transaction exactly as they are.
#[cfg(feature = "failpoints")]
fn failpoint_crash<T>(name: &str) -> T {
    eprintln!("failpoint {name}: crashing");
    std::process::abort()
}
