//! The open Kafka transaction as operators see it: `GET /transactions`, the
//! `streamstate_transaction_*` metrics and the near-timeout warning.
//!
//! The sink reports every begin, commit and abort here; the admin server and a watcher
//! task read it. It lives outside the job loop on purpose: a transaction hangs exactly
//! when the loop is stuck (a slow snapshot upload, a broker that will not answer), so
//! the age must keep growing and the warning must fire without the loop's help.
//!
//! The broker aborts a transaction that stays open longer than `transaction.timeout.ms`;
//! this instance then learns it at commit time and rewinds (or, if a newer producer took
//! the id, exits). The warning at [`WARN_FRACTION`] of the timeout says that is coming.
//!
//! The sink also reports each transactional call while librdkafka holds it. A call that
//! outlives its bound by [`STUCK_GRACE`] is stuck: librdkafka was seen holding
//! `send_offsets_to_transaction` for minutes, whatever its timeout, while the broker was
//! away. Only the process can end such a call, so the watcher ends the process (a crash at
//! that point, which the commit protocol makes safe) and the restart settles the transaction.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::checkpoint::CheckpointRef;

/// The warning fires once per transaction when its age passes this share of
/// `transaction.timeout.ms`.
pub const WARN_FRACTION: f64 = 0.8;

/// Time a transactional call gets past its bound before the process ends itself.
pub const STUCK_GRACE: Duration = Duration::from_secs(10);

/// What `GET /transactions` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransactionView {
    /// The producer of the oldest open transaction (the first of the pool when none is
    /// open): `<app_id>-<instance>-<slot>`.
    pub transactional_id: String,
    /// Every producer of the pool, one per epoch in flight at most.
    pub transactional_ids: Vec<String>,
    /// `init_transactions` calls this process made (1 once started). Each one raised the
    /// broker's producer epoch for the transactional id and fenced every older holder of
    /// it; librdkafka does not expose the epoch number itself (`kafka-transactions.sh
    /// describe` shows it).
    pub producer_inits: u64,
    /// Unix ms of the last `init_transactions`.
    pub producer_initialized_at_ms: Option<u64>,
    /// Transactions this process began: the job's epoch counter (epoch `e` writes `T_e`).
    pub transactions_begun: u64,
    pub open: bool,
    /// Transactions open now: the epoch taking records plus those still uploading or
    /// committing. The fields below describe the oldest, the one nearest its timeout.
    pub open_transactions: usize,
    /// Unix ms the open transaction began.
    pub opened_at_ms: Option<u64>,
    pub age_ms: Option<u64>,
    /// The checkpoint whose commit ends the open transaction (`chk-<id>-<run>`).
    pub checkpoint: Option<String>,
    pub checkpoint_id: Option<u64>,
    /// The last checkpoint whose transaction this process committed.
    pub last_committed_checkpoint: Option<String>,
    pub committed: u64,
    pub aborted: u64,
    /// `kafka.transaction_timeout` as sent to the broker.
    pub transaction_timeout_ms: u64,
    /// Age at which the near-timeout warning fires.
    pub warn_after_ms: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// The pool's transactional ids, in slot order.
    ids: Vec<String>,
    timeout: Duration,
    inits: u64,
    initialized_at_ms: Option<u64>,
    begun: u64,
    /// Open transactions, oldest first.
    open: Vec<Open>,
    last_committed: Option<CheckpointRef>,
    committed: u64,
    aborted: u64,
    /// The transactional call librdkafka holds now.
    call: Option<Call>,
}

#[derive(Debug)]
struct Open {
    at_ms: u64,
    checkpoint: CheckpointRef,
    transactional_id: String,
    /// Already warned about.
    warned: bool,
}

#[derive(Debug)]
struct Call {
    what: &'static str,
    setting: &'static str,
    bound: Duration,
    /// Time the watcher has seen the call in progress (its ticks, not the wall clock).
    watched: Duration,
}

/// A transactional call that outlived its bound by [`STUCK_GRACE`], logged once before the
/// process ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckCall {
    pub what: &'static str,
    pub setting: &'static str,
    pub bound: Duration,
    pub waited: Duration,
}

impl StuckCall {
    pub fn log(&self) {
        tracing::error!(
            event = "transactional_call_stuck",
            call = self.what,
            bound_ms = self.bound.as_millis() as u64,
            waited_ms = self.waited.as_millis() as u64,
            "kafka producer: {} has not returned after {:?} ({} is {:?}); \
             exiting so that the restart resumes from the last committed checkpoint",
            self.what,
            self.waited,
            self.setting,
            self.bound
        );
    }
}

/// The near-timeout warning, logged once per transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearTimeout {
    pub transactional_id: String,
    pub checkpoint: String,
    pub age: Duration,
    pub timeout: Duration,
}

impl NearTimeout {
    pub fn log(&self) {
        tracing::warn!(
            event = "transaction_near_timeout",
            transactional_id = %self.transactional_id,
            checkpoint = %self.checkpoint,
            age_ms = self.age.as_millis() as u64,
            timeout_ms = self.timeout.as_millis() as u64,
            "the open transaction nears transaction.timeout.ms: the broker will abort it and this \
             epoch will be redone; see docs/reliability.md (hanging transactions)"
        );
    }
}

/// Shared between the sink (writer) and the admin server and watcher (readers).
#[derive(Debug, Default)]
pub struct Transactions {
    inner: Mutex<Inner>,
}

impl Transactions {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A panic while holding this lock cannot leave the fields inconsistent in a way
        // that matters for a read-only view, so a poisoned lock is used as is.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// `init_transactions` returned for `transactional_id` (a producer of the pool).
    pub fn initialized(&self, transactional_id: &str, timeout: Duration) {
        self.with(|i| {
            if !i.ids.iter().any(|id| id == transactional_id) {
                i.ids.push(transactional_id.to_string());
            }
            i.timeout = timeout;
            i.inits += 1;
            i.initialized_at_ms = Some(unix_ms());
            i.open.retain(|o| o.transactional_id != transactional_id);
        });
    }

    pub fn begun(&self, transactional_id: &str, checkpoint: &CheckpointRef) {
        self.with(|i| {
            i.begun += 1;
            i.open.push(Open {
                at_ms: unix_ms(),
                checkpoint: checkpoint.clone(),
                transactional_id: transactional_id.to_string(),
                warned: false,
            });
        });
    }

    /// The open transaction of an epoch that has nothing to commit started again: it holds
    /// no record, so the broker keeps no timer for it either.
    pub fn renewed(&self, checkpoint: &CheckpointRef) {
        self.with(|i| {
            if let Some(o) = i.open.iter_mut().find(|o| &o.checkpoint == checkpoint) {
                o.at_ms = unix_ms();
                o.warned = false;
            }
        });
    }

    pub fn committed(&self, checkpoint: &CheckpointRef) {
        self.with(|i| {
            i.committed += 1;
            i.open.retain(|o| &o.checkpoint != checkpoint);
            i.last_committed = Some(checkpoint.clone());
        });
    }

    pub fn aborted(&self, checkpoint: &CheckpointRef) {
        self.with(|i| {
            i.aborted += 1;
            i.open.retain(|o| &o.checkpoint != checkpoint);
        });
    }

    /// The sink entered a transactional call bounded by `setting` (`bound`).
    pub fn call_started(&self, what: &'static str, setting: &'static str, bound: Duration) {
        self.with(|i| {
            i.call = Some(Call {
                what,
                setting,
                bound,
                watched: Duration::ZERO,
            })
        });
    }

    /// The call returned, whatever its result.
    pub fn call_ended(&self) {
        self.with(|i| i.call = None);
    }

    /// Called by the watcher once per `tick`: the call in progress, once it has been
    /// watched for longer than its bound plus [`STUCK_GRACE`]. Counting ticks rather than
    /// reading the clock means a process that was paused (SIGSTOP) is not judged on the
    /// pause: resumed, its call first gets to hear the broker's answer (e.g. "fenced").
    pub fn check_stuck(&self, tick: Duration) -> Option<StuckCall> {
        self.with(|i| {
            let call = i.call.as_mut()?;
            call.watched += tick;
            (call.watched > call.bound + STUCK_GRACE).then_some(StuckCall {
                what: call.what,
                setting: call.setting,
                bound: call.bound,
                waited: call.watched,
            })
        })
    }

    /// Age of the oldest open transaction; zero when none is open.
    pub fn open_age(&self) -> Duration {
        self.with(|i| {
            i.open.first().map_or(Duration::ZERO, |o| {
                Duration::from_millis(unix_ms().saturating_sub(o.at_ms))
            })
        })
    }

    pub fn view(&self) -> TransactionView {
        let now = unix_ms();
        self.with(|i| {
            let oldest = i.open.first();
            TransactionView {
                transactional_id: oldest
                    .map(|o| o.transactional_id.clone())
                    .or_else(|| i.ids.first().cloned())
                    .unwrap_or_default(),
                transactional_ids: i.ids.clone(),
                producer_inits: i.inits,
                producer_initialized_at_ms: i.initialized_at_ms,
                transactions_begun: i.begun,
                open: oldest.is_some(),
                open_transactions: i.open.len(),
                opened_at_ms: oldest.map(|o| o.at_ms),
                age_ms: oldest.map(|o| now.saturating_sub(o.at_ms)),
                checkpoint: oldest.map(|o| o.checkpoint.to_string()),
                checkpoint_id: oldest.map(|o| o.checkpoint.id),
                last_committed_checkpoint: i.last_committed.as_ref().map(ToString::to_string),
                committed: i.committed,
                aborted: i.aborted,
                transaction_timeout_ms: i.timeout.as_millis() as u64,
                warn_after_ms: i.timeout.mul_f64(WARN_FRACTION).as_millis() as u64,
            }
        })
    }

    /// The warning for an open transaction, the first time its age passes
    /// [`WARN_FRACTION`] of the timeout; `None` otherwise.
    pub fn check_near_timeout(&self) -> Option<NearTimeout> {
        self.check_at(unix_ms())
    }

    fn check_at(&self, now_ms: u64) -> Option<NearTimeout> {
        self.with(|i| {
            let timeout = i.timeout;
            if timeout.is_zero() {
                return None;
            }
            let o = i.open.iter_mut().find(|o| {
                !o.warned
                    && Duration::from_millis(now_ms.saturating_sub(o.at_ms))
                        >= timeout.mul_f64(WARN_FRACTION)
            })?;
            o.warned = true;
            Some(NearTimeout {
                transactional_id: o.transactional_id.clone(),
                checkpoint: o.checkpoint.to_string(),
                age: Duration::from_millis(now_ms.saturating_sub(o.at_ms)),
                timeout,
            })
        })
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_follows_begin_commit_and_abort() {
        let t = Transactions::default();
        t.initialized("app-0", Duration::from_secs(60));
        let v = t.view();
        assert_eq!(
            (v.producer_inits, v.open, v.transactions_begun),
            (1, false, 0)
        );
        assert_eq!(
            (v.transaction_timeout_ms, v.warn_after_ms),
            (60_000, 48_000)
        );
        let c1 = CheckpointRef::new(1, "r");
        t.begun("app-0", &c1);
        let v = t.view();
        assert!(v.open);
        assert_eq!(v.checkpoint_id, Some(1));
        assert_eq!(v.checkpoint.as_deref(), Some(c1.to_string().as_str()));
        t.committed(&c1);
        let v = t.view();
        assert!(!v.open && v.age_ms.is_none());
        assert_eq!(v.last_committed_checkpoint, Some(c1.to_string()));
        let c2 = CheckpointRef::new(2, "r");
        t.begun("app-0", &c2);
        t.aborted(&c2);
        let v = t.view();
        assert_eq!((v.transactions_begun, v.committed, v.aborted), (2, 1, 1));
        assert_eq!(t.open_age(), Duration::ZERO);
    }

    #[test]
    fn view_describes_the_oldest_of_several_open_transactions() {
        let t = Transactions::default();
        for id in ["app-0-0", "app-0-1", "app-0-2"] {
            t.initialized(id, Duration::from_secs(60));
        }
        let (c1, c2) = (CheckpointRef::new(1, "r"), CheckpointRef::new(2, "r"));
        t.begun("app-0-0", &c1);
        t.begun("app-0-1", &c2);
        let v = t.view();
        assert_eq!(v.transactional_ids, vec!["app-0-0", "app-0-1", "app-0-2"]);
        assert_eq!((v.open_transactions, v.checkpoint_id), (2, Some(1)));
        assert_eq!(v.transactional_id, "app-0-0");
        t.committed(&c1);
        let v = t.view();
        assert_eq!((v.open_transactions, v.checkpoint_id), (1, Some(2)));
        assert_eq!(v.transactional_id, "app-0-1");
        assert_eq!(v.last_committed_checkpoint, Some(c1.to_string()));
    }

    #[test]
    fn a_call_is_stuck_only_after_its_bound_plus_the_grace_of_watched_ticks() {
        let t = Transactions::default();
        let tick = Duration::from_secs(1);
        assert_eq!(t.check_stuck(tick), None, "no call in progress");
        t.call_started(
            "commit_transaction",
            "checkpoint.timeout",
            Duration::from_secs(3),
        );
        let limit = 3 + STUCK_GRACE.as_secs();
        for n in 1..=limit {
            assert_eq!(t.check_stuck(tick), None, "tick {n} of {limit}");
        }
        let stuck = t.check_stuck(tick).expect("stuck past bound + grace");
        assert_eq!(
            (stuck.what, stuck.setting, stuck.bound, stuck.waited),
            (
                "commit_transaction",
                "checkpoint.timeout",
                Duration::from_secs(3),
                Duration::from_secs(limit + 1)
            )
        );
        t.call_ended();
        assert_eq!(t.check_stuck(tick), None, "the call returned");
        t.call_started(
            "abort_transaction",
            "checkpoint.timeout",
            Duration::from_secs(3),
        );
        assert_eq!(t.check_stuck(tick), None, "a new call starts from zero");
    }

    #[test]
    fn near_timeout_warns_once_per_transaction_past_the_fraction() {
        let t = Transactions::default();
        t.initialized("app-0", Duration::from_secs(10));
        assert_eq!(t.check_at(unix_ms() + 60_000), None, "nothing open");
        let c1 = CheckpointRef::new(1, "r");
        t.begun("app-0", &c1);
        let opened = t.view().opened_at_ms.expect("open");
        assert_eq!(t.check_at(opened + 7_999), None);
        let w = t.check_at(opened + 8_000).expect("warning at 80%");
        assert_eq!(w.age, Duration::from_secs(8));
        assert_eq!(w.transactional_id, "app-0");
        assert_eq!(t.check_at(opened + 9_000), None, "once per transaction");
        t.committed(&c1);
        t.begun("app-0", &CheckpointRef::new(2, "r"));
        let opened = t.view().opened_at_ms.expect("open");
        assert!(
            t.check_at(opened + 8_500).is_some(),
            "a new transaction warns again"
        );
    }
}
