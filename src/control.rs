//! Rules from the control topic, kept in broadcast state.
//!
//! Every instance reads every control partition from its checkpointed offsets, so all
//! instances hold the same rules and a restore brings back exactly the rules that were
//! in force at the checkpoint. Record key = rule id, value = rule JSON; a tombstone or
//! `"status": "deleted"` removes the rule. A version at or below the applied one is
//! ignored, so replays and reordered publishes cannot roll a rule back. A rejected rule
//! leaves the last good version in force.
//!
//! This module owns versioning and storage; what a rule *means* is the process
//! function's, which sees each newer version first and may refuse it.
//!
//! The last [`HISTORY_VERSIONS`] applied versions of each rule (deletions included) are
//! kept in a second broadcast state, `rules.history`, so every instance has the same
//! history, it survives restores, and `POST /rules/{id}/rollback` can republish an older
//! body as a new version. A separate state rather than a field of [`StoredRule`] keeps
//! checkpoints written before the history existed restorable.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use streamstate_state::{BroadcastState, MapStateDescriptor, StateError, StateStore};

use crate::decode::{DecodeError, parse_json};
use crate::function::BroadcastContext;

/// The broadcast state holding each rule's [`RuleVersion`]s.
pub const HISTORY_STATE: &str = "rules.history";

/// Rules larger than this are refused; a rule is configuration, not data.
pub const MAX_RULE_BYTES: usize = 64 * 1024;

/// One rule as kept in broadcast state (and so in every checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRule {
    pub version: u64,
    /// `None` once deleted: the version stays so older publishes cannot resurrect it.
    pub body: Option<String>,
    pub applied_at_ms: u64,
    pub partition: i32,
    pub offset: i64,
}

/// Applied versions kept per rule (the one in force included).
pub const HISTORY_VERSIONS: usize = 10;

/// One applied version in the `rules.history` broadcast state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleVersion {
    pub version: u64,
    /// `None` for a deletion.
    pub body: Option<String>,
    pub applied_at_ms: u64,
    pub partition: i32,
    pub offset: i64,
}

/// What `GET /rules` shows; refreshed by the job loop, read by the admin server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleView {
    pub id: String,
    pub version: u64,
    /// `deleted`, or the rule's own `status` (`active` when it has none).
    pub status: String,
    pub applied_at_ms: u64,
    pub control_partition: i32,
    pub control_offset: i64,
    pub rule: Value,
    /// Events that passed the rule's filter since this process started (all versions;
    /// replays after a restore count again). Filled in by the admin server from the
    /// rule engine's metrics.
    pub matches: u64,
    /// Records the rule emitted since this process started (all versions; a shadow
    /// rule's suppressed outputs are not counted here). Filled in like `matches`.
    pub outputs: u64,
    /// Applied versions, oldest first, the one in force last; only `GET /rules/{id}`
    /// shows it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<VersionView>,
}

/// One entry of [`RuleView::history`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VersionView {
    pub version: u64,
    pub status: String,
    pub applied_at_ms: u64,
    pub control_partition: i32,
    pub control_offset: i64,
    /// The body as published; `null` for a deletion.
    pub rule: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollbackError {
    #[error("rule {0:?} has no earlier version with a body in its history")]
    NoPreviousVersion(String),
}

impl RuleView {
    /// The body `POST /rules/{id}/rollback` publishes: the newest earlier version that
    /// was not a deletion, re-versioned as the current version + 1 (the runtime ignores
    /// versions at or below the applied one). Rolling back twice therefore swaps back.
    pub fn rollback_body(&self) -> Result<Value, RollbackError> {
        // The last entry is the version in force (a tombstone keeps the version number it
        // deleted, so the number alone cannot tell it from its predecessor).
        let in_force = usize::from(
            self.history
                .last()
                .is_some_and(|v| v.version == self.version),
        );
        let previous = self
            .history
            .iter()
            .rev()
            .skip(in_force)
            .find(|v| v.rule.is_object())
            .ok_or_else(|| RollbackError::NoPreviousVersion(self.id.clone()))?;
        let mut body = previous.rule.clone();
        if let Some(o) = body.as_object_mut() {
            o.insert("version".into(), Value::from(self.version + 1));
        }
        Ok(body)
    }
}

/// `deleted`, or the body's own `status` (`active` when it has none).
fn status_of(body: &Value, deleted: bool) -> String {
    match body.get("status").and_then(Value::as_str) {
        _ if deleted => "deleted".to_string(),
        Some(s) => s.to_string(),
        None => "active".to_string(),
    }
}

fn parse_body(body: Option<&str>) -> Value {
    body.and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null)
}

pub type RulesView = Arc<RwLock<BTreeMap<String, RuleView>>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleOutcome {
    Applied {
        id: String,
        version: u64,
    },
    Deleted {
        id: String,
    },
    /// Not newer than the applied version.
    Ignored {
        id: String,
        version: u64,
        applied: u64,
    },
    Rejected(RuleRejection),
    /// The process function refused the update (the rule engine: not valid rule language).
    Refused {
        id: String,
        version: u64,
        reason: &'static str,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleRejection {
    #[error("control record has no key (the rule id)")]
    NoKey,
    #[error("rule id (record key) is not UTF-8")]
    KeyNotUtf8,
    #[error(transparent)]
    Json(#[from] DecodeError),
    #[error("rule is not a JSON object")]
    NotObject,
    #[error("rule field `id` ({id:?}) differs from the record key {key:?}")]
    IdMismatch { key: String, id: String },
    #[error("rule field `version` must be a non-negative integer")]
    BadVersion,
    #[error("rule field `status` must be a string")]
    BadStatus,
}

impl RuleRejection {
    /// Fixed label for metrics and the dead-letter reason header.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoKey => "rule_no_key",
            Self::KeyNotUtf8 => "rule_key_not_utf8",
            Self::Json(e) => e.reason(),
            Self::NotObject => "rule_not_object",
            Self::IdMismatch { .. } => "rule_id_mismatch",
            Self::BadVersion => "rule_bad_version",
            Self::BadStatus => "rule_bad_status",
        }
    }
}

pub struct Rules {
    state: BroadcastState<String, StoredRule>,
    history: BroadcastState<String, Vec<RuleVersion>>,
    view: RulesView,
}

impl Rules {
    /// Binds to the store's `rules` broadcast state (written only from here); `view` is
    /// what the admin server reads.
    pub fn new(store: &StateStore, view: RulesView) -> Self {
        let ctx = BroadcastContext::new(store);
        let state = ctx.broadcast_state(&MapStateDescriptor::<String, StoredRule>::new("rules"));
        let history = ctx.broadcast_state(&MapStateDescriptor::new(HISTORY_STATE));
        Self {
            state,
            history,
            view,
        }
    }

    pub fn view(&self) -> RulesView {
        self.view.clone()
    }

    /// Checks one control record against the version in force. A newer version (or a
    /// deletion) comes back as a [`Candidate`] for the process function to accept or
    /// refuse; anything else is already an outcome. Errors are only state-layer failures;
    /// a bad record is an outcome, not an error.
    pub fn prepare(
        &self,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        partition: i32,
        offset: i64,
        now_ms: u64,
    ) -> Result<Result<Candidate, RuleOutcome>, StateError> {
        let parsed = match parse(key, payload) {
            Ok(p) => p,
            Err(r) => return Ok(Err(RuleOutcome::Rejected(r))),
        };
        let id = parsed.id;
        let applied = self.state.get(&id)?;
        let stored = match (parsed.version, applied) {
            // A tombstone removes whatever version is in force.
            (None, Some(current)) => StoredRule {
                body: None,
                applied_at_ms: now_ms,
                partition,
                offset,
                ..current
            },
            (None, None) => return Ok(Err(RuleOutcome::Deleted { id })),
            (Some(v), Some(current)) if v <= current.version => {
                return Ok(Err(RuleOutcome::Ignored {
                    id,
                    version: v,
                    applied: current.version,
                }));
            }
            (Some(version), _) => StoredRule {
                version,
                body: parsed.body.as_ref().map(Value::to_string),
                applied_at_ms: now_ms,
                partition,
                offset,
            },
        };
        Ok(Ok(Candidate {
            id,
            body: parsed.body,
            stored,
        }))
    }

    /// Puts an accepted candidate in force.
    pub fn commit(&self, candidate: Candidate) -> Result<RuleOutcome, StateError> {
        let Candidate { id, stored, .. } = candidate;
        crate::crash_point!("apply-rule");
        self.state.put(&id, &stored)?;
        let mut history = self.history.get(&id)?.unwrap_or_default();
        history.push(RuleVersion {
            version: stored.version,
            body: stored.body.clone(),
            applied_at_ms: stored.applied_at_ms,
            partition: stored.partition,
            offset: stored.offset,
        });
        let excess = history.len().saturating_sub(HISTORY_VERSIONS);
        history.drain(..excess);
        self.history.put(&id, &history)?;
        self.refresh_view()?;
        Ok(if stored_is_deleted(&stored) {
            RuleOutcome::Deleted { id }
        } else {
            RuleOutcome::Applied {
                id,
                version: stored.version,
            }
        })
    }

    /// `prepare` then `commit`, for callers that accept every update.
    #[cfg(test)]
    fn apply(
        &self,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        partition: i32,
        offset: i64,
        now_ms: u64,
    ) -> Result<RuleOutcome, StateError> {
        match self.prepare(key, payload, partition, offset, now_ms)? {
            Ok(c) => self.commit(c),
            Err(outcome) => Ok(outcome),
        }
    }

    /// Rules in force (not deleted), from the view the last change refreshed.
    pub fn active(&self) -> usize {
        self.view
            .read()
            .map_or(0, |v| v.values().filter(|r| r.status != "deleted").count())
    }

    /// Rebuilds the admin view from broadcast state (after a restore or rewind).
    pub fn refresh_view(&self) -> Result<(), StateError> {
        let mut view = BTreeMap::new();
        let mut histories: BTreeMap<String, Vec<RuleVersion>> =
            self.history.entries()?.into_iter().collect();
        for (id, r) in self.state.entries()? {
            let rule = parse_body(r.body.as_deref());
            let status = status_of(&rule, stored_is_deleted(&r));
            let history = histories
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .map(|v| {
                    let rule = parse_body(v.body.as_deref());
                    VersionView {
                        version: v.version,
                        status: status_of(&rule, v.body.is_none()),
                        applied_at_ms: v.applied_at_ms,
                        control_partition: v.partition,
                        control_offset: v.offset,
                        rule,
                    }
                })
                .collect();
            view.insert(
                id.clone(),
                RuleView {
                    id,
                    version: r.version,
                    status,
                    applied_at_ms: r.applied_at_ms,
                    control_partition: r.partition,
                    control_offset: r.offset,
                    rule,
                    matches: 0,
                    outputs: 0,
                    history,
                },
            );
        }
        if let Ok(mut v) = self.view.write() {
            *v = view;
        }
        Ok(())
    }
}

fn stored_is_deleted(r: &StoredRule) -> bool {
    r.body.is_none()
}

struct Parsed {
    id: String,
    /// `None` for a tombstone.
    version: Option<u64>,
    /// `None` when the rule says `"status": "deleted"`.
    body: Option<Value>,
}

/// A control update newer than the version in force, not yet applied.
#[derive(Debug)]
pub struct Candidate {
    pub id: String,
    /// The parsed rule; `None` deletes it.
    pub body: Option<Value>,
    stored: StoredRule,
}

impl Candidate {
    pub fn version(&self) -> u64 {
        self.stored.version
    }
}

fn parse(key: Option<&[u8]>, payload: Option<&[u8]>) -> Result<Parsed, RuleRejection> {
    let key = key.filter(|k| !k.is_empty()).ok_or(RuleRejection::NoKey)?;
    let id = std::str::from_utf8(key)
        .map_err(|_| RuleRejection::KeyNotUtf8)?
        .to_string();
    let Some(payload) = payload.filter(|p| !p.is_empty()) else {
        return Ok(Parsed {
            id,
            version: None,
            body: None,
        });
    };
    let value = parse_json(Some(payload), MAX_RULE_BYTES)?;
    let obj = value.as_object().ok_or(RuleRejection::NotObject)?;
    match obj.get("id").and_then(Value::as_str) {
        Some(body_id) if body_id == id => {}
        other => {
            return Err(RuleRejection::IdMismatch {
                key: id,
                id: other.unwrap_or_default().to_string(),
            });
        }
    }
    let version = obj
        .get("version")
        .and_then(Value::as_u64)
        .ok_or(RuleRejection::BadVersion)?;
    let deleted = match obj.get("status").map(|s| s.as_str()) {
        Some(Some("deleted")) => true,
        Some(None) => return Err(RuleRejection::BadStatus),
        // Other statuses are the process function's to judge.
        _ => false,
    };
    let body = (!deleted).then_some(value);
    Ok(Parsed {
        id,
        version: Some(version),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamstate_state::{BackendKind, StoreConfig};

    fn rules() -> (tempfile::TempDir, StateStore, Rules) {
        let dir = tempfile::tempdir().expect("dir");
        let store =
            StateStore::open(StoreConfig::new(BackendKind::Hashmap, dir.path(), 4)).expect("store");
        let rules = Rules::new(&store, RulesView::default());
        (dir, store, rules)
    }

    fn apply(r: &Rules, key: &str, body: Option<&str>) -> RuleOutcome {
        r.apply(Some(key.as_bytes()), body.map(str::as_bytes), 0, 0, 0)
            .expect("apply")
    }

    #[test]
    fn newer_versions_apply_and_older_ones_are_ignored() {
        let (_d, _s, r) = rules();
        assert_eq!(
            apply(&r, "a", Some(r#"{"id":"a","version":2}"#)),
            RuleOutcome::Applied {
                id: "a".into(),
                version: 2
            }
        );
        assert_eq!(
            apply(&r, "a", Some(r#"{"id":"a","version":2,"x":1}"#)),
            RuleOutcome::Ignored {
                id: "a".into(),
                version: 2,
                applied: 2
            }
        );
        assert_eq!(
            apply(&r, "a", Some(r#"{"id":"a","version":3}"#)),
            RuleOutcome::Applied {
                id: "a".into(),
                version: 3
            }
        );
        assert_eq!(r.view().read().expect("view")["a"].version, 3);
        assert_eq!(r.active(), 1);
    }

    #[test]
    fn deletion_keeps_the_version_so_old_publishes_cannot_resurrect() {
        let (_d, _s, r) = rules();
        apply(&r, "a", Some(r#"{"id":"a","version":1}"#));
        assert_eq!(
            apply(
                &r,
                "a",
                Some(r#"{"id":"a","version":2,"status":"deleted"}"#)
            ),
            RuleOutcome::Deleted { id: "a".into() }
        );
        assert!(matches!(
            apply(&r, "a", Some(r#"{"id":"a","version":1}"#)),
            RuleOutcome::Ignored { .. }
        ));
        assert_eq!(r.active(), 0);
        apply(&r, "b", Some(r#"{"id":"b","version":1}"#));
        assert_eq!(
            apply(&r, "b", None),
            RuleOutcome::Deleted { id: "b".into() }
        );
        assert_eq!(r.active(), 0);
        assert_eq!(r.view().read().expect("view")["b"].status, "deleted");
    }

    #[test]
    fn bad_rules_are_rejected_with_a_reason_and_leave_the_last_good_version() {
        let (_d, _s, r) = rules();
        apply(&r, "a", Some(r#"{"id":"a","version":1}"#));
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let huge = format!(
            r#"{{"id":"a","version":9,"pad":"{}"}}"#,
            "x".repeat(MAX_RULE_BYTES)
        );
        for (body, reason) in [
            ("{nope", "invalid_json"),
            ("[1,2]", "rule_not_object"),
            (r#"{"id":"b","version":5}"#, "rule_id_mismatch"),
            (r#"{"id":"a","version":-1}"#, "rule_bad_version"),
            (r#"{"id":"a","version":5,"status":7}"#, "rule_bad_status"),
            (deep.as_str(), "too_deep"),
            (huge.as_str(), "too_large"),
        ] {
            match apply(&r, "a", Some(body)) {
                RuleOutcome::Rejected(rej) => assert_eq!(rej.reason(), reason, "{body:.40}"),
                other => panic!("{body:.40} must be rejected, got {other:?}"),
            }
        }
        assert!(matches!(
            r.apply(None, Some(b"{}"), 0, 0, 0).expect("apply"),
            RuleOutcome::Rejected(RuleRejection::NoKey)
        ));
        assert_eq!(r.view().read().expect("view")["a"].version, 1);
    }

    #[test]
    fn history_keeps_the_last_versions_and_rollback_picks_the_previous_body() {
        let (_d, _s, r) = rules();
        apply(&r, "a", Some(r#"{"id":"a","version":1,"x":"one"}"#));
        let view = |r: &Rules| r.view().read().expect("view")["a"].clone();
        assert_eq!(
            view(&r).rollback_body(),
            Err(RollbackError::NoPreviousVersion("a".into()))
        );
        apply(&r, "a", Some(r#"{"id":"a","version":2,"x":"two"}"#));
        assert_eq!(
            view(&r).rollback_body().expect("previous"),
            serde_json::json!({"id":"a","version":3,"x":"one"})
        );
        // A deletion can be rolled back: the previous body comes back.
        apply(
            &r,
            "a",
            Some(r#"{"id":"a","version":3,"status":"deleted"}"#),
        );
        let deleted = view(&r);
        assert_eq!(
            deleted.history.last().map(|v| v.status.as_str()),
            Some("deleted")
        );
        assert_eq!(
            deleted.rollback_body().expect("previous"),
            serde_json::json!({"id":"a","version":4,"x":"two"})
        );
        // A tombstone keeps the deleted version's number; rollback still finds the body.
        apply(&r, "b", Some(r#"{"id":"b","version":7,"x":"seven"}"#));
        apply(&r, "b", None);
        assert_eq!(
            r.view().read().expect("view")["b"]
                .rollback_body()
                .expect("previous"),
            serde_json::json!({"id":"b","version":8,"x":"seven"})
        );
        for v in 4..20u64 {
            apply(&r, "a", Some(&format!(r#"{{"id":"a","version":{v}}}"#)));
        }
        let h = view(&r).history;
        assert_eq!(h.len(), HISTORY_VERSIONS);
        assert_eq!(h.first().map(|v| v.version), Some(10));
        assert_eq!(h.last().map(|v| v.version), Some(19));
    }

    #[test]
    fn rules_survive_snapshot_and_restore() {
        let (d, store, r) = rules();
        apply(&r, "a", Some(r#"{"id":"a","version":4}"#));
        let snap = store.snapshot(1, &d.path().join("snap")).expect("snapshot");
        apply(&r, "a", Some(r#"{"id":"a","version":5}"#));
        store
            .restore(&[(d.path().join("snap"), snap)])
            .expect("restore");
        r.refresh_view().expect("view");
        assert_eq!(r.view().read().expect("view")["a"].version, 4);
        let history: Vec<u64> = r.view().read().expect("view")["a"]
            .history
            .iter()
            .map(|v| v.version)
            .collect();
        assert_eq!(history, vec![4], "history is restored with the rule");
    }
}
