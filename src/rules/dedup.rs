//! `kind: "dedup"`: the first event per field value within the TTL is emitted; later
//! ones are dropped and counted.
//!
//! Each seen value is one entry of a TTL'd map state (entry = first-seen time; the
//! state layer's processing-time TTL removes it `ttl` after it was written). The
//! decision itself compares the event's time with the stored first-seen time, so in
//! event-time mode duplicates are judged by event time; the state TTL is cleanup.

use super::output::{Field, record};
use super::spec::{DedupSpec, Rule};
use super::window::{self, namespace};
use super::{Env, States};
use crate::function::{Event, FunctionError, Output, Upcoming};
use streamstate_state::Prefetch;

pub(crate) fn on_event(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    d: &DedupSpec,
    ev: &Event<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let Some(v) = d.field.resolve(ev.value) else {
        env.eval_error("field_missing");
        return Ok(());
    };
    let seen = st.dedup(d.ttl_ms)?;
    env.set_namespace(&namespace(&rule.id, rule.version, window::DEDUP, None));
    let k = v.to_string();
    let ts = ev.timestamp_ms;
    match seen.get(&k)? {
        Some(first) if ts < first.saturating_add(d.ttl_ms) => {
            env.metrics.dedup_dropped.inc();
            Ok(())
        }
        _ => {
            seen.put(&k, &ts)?;
            let extra = [(
                "dedup",
                Field::Dedup {
                    field: d.field.as_str(),
                    ttl_ms: d.ttl_ms,
                },
            )];
            let r = record(rule, ev.key, ev.value, None, Some(ev.source), ts, extra);
            env.emit(out, rule, ev.key, &r)
        }
    }
}

/// Names the entry [`on_event`] will read for `ev`, for the batch's read-ahead.
pub(crate) fn prefetch(
    st: &mut States,
    rule: &Rule,
    d: &DedupSpec,
    ev: &Upcoming<'_>,
    ahead: &mut Prefetch,
) -> Result<(), FunctionError> {
    let Some(v) = d.field.resolve(ev.value) else {
        return Ok(());
    };
    let ns = namespace(&rule.id, rule.version, window::DEDUP, None);
    Ok(st
        .dedup(d.ttl_ms)?
        .prefetch(ahead, ev.key.as_bytes(), &ns, &v.to_string())?)
}
