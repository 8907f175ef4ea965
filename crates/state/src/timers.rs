//! Timers per key and namespace. They are stored in the backend (key group
//! first, so they move with their key on rescale and ride in every snapshot)
//! and mirrored in an in-memory time-ordered index so the runtime can ask
//! "what is due?" without a scan.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::backend::KvBackend;
use crate::error::Result;
use crate::keygroup::{KeyGroupRange, KeyGroups};
use crate::layout::{self, TIMER_EVENT, TIMER_PROCESSING};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TimeDomain {
    EventTime,
    ProcessingTime,
}

impl TimeDomain {
    fn id(self) -> u16 {
        match self {
            TimeDomain::EventTime => TIMER_EVENT,
            TimeDomain::ProcessingTime => TIMER_PROCESSING,
        }
    }
}

/// A due timer: set it as current key/namespace and call `on_timer`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timer {
    pub timestamp: u64,
    pub key: Vec<u8>,
    pub namespace: Vec<u8>,
    pub domain: TimeDomain,
}

type Entry = (u64, Vec<u8>, Vec<u8>);

#[derive(Default)]
pub(crate) struct TimerIndex {
    event: BTreeSet<Entry>,
    processing: BTreeSet<Entry>,
}

impl TimerIndex {
    fn set(&mut self, d: TimeDomain) -> &mut BTreeSet<Entry> {
        match d {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// The index of the timers stored in `backend` for `range` (after a restore).
    pub(crate) fn load(backend: &mut dyn KvBackend, range: KeyGroupRange) -> Result<Self> {
        let mut index = Self::default();
        for kg in range.start..=range.end {
            for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
                let mut start = (kg as u16).to_be_bytes().to_vec();
                start.extend_from_slice(&domain.id().to_be_bytes());
                let end = layout::prefix_end(&start);
                let mut found = Vec::new();
                backend.scan(&start, &end, &mut |k, _| {
                    found.push(k.to_vec());
                    true
                })?;
                for k in found {
                    let p = layout::decode_key(&k)?;
                    index
                        .set(domain)
                        .insert((p.ts.unwrap_or(0), p.key.to_vec(), p.ns.to_vec()));
                }
            }
        }
        Ok(index)
    }

    /// Stores and indexes a timer (registering the same one twice leaves one), or
    /// removes it from both.
    pub(crate) fn change(
        &mut self,
        backend: &mut dyn KvBackend,
        at: TimerAt<'_>,
        domain: TimeDomain,
        timestamp: u64,
        change: TimerChange,
    ) -> Result<()> {
        layout::encode_timer(
            at.buf,
            at.key_group,
            domain.id(),
            timestamp,
            at.key,
            at.namespace,
        );
        let entry = (timestamp, at.key.to_vec(), at.namespace.to_vec());
        match change {
            TimerChange::Register => {
                backend.put(at.buf, &[])?;
                self.set(domain).insert(entry);
            }
            TimerChange::Delete => {
                backend.delete(at.buf)?;
                self.set(domain).remove(&entry);
            }
        }
        Ok(())
    }

    /// The earliest timer of `domain`.
    pub(crate) fn next(&mut self, domain: TimeDomain) -> Option<u64> {
        self.set(domain).first().map(|e| e.0)
    }

    /// Removes (from the index and `backend`) and returns every timer with `timestamp
    /// <= up_to`, in time order (ties by key, then namespace).
    pub(crate) fn pop_due(
        &mut self,
        backend: &mut dyn KvBackend,
        buf: &mut Vec<u8>,
        key_groups: KeyGroups,
        domain: TimeDomain,
        up_to: u64,
    ) -> Result<Vec<Timer>> {
        let mut out = Vec::new();
        while self
            .set(domain)
            .first()
            .is_some_and(|first| first.0 <= up_to)
        {
            let Some((ts, key, ns)) = self.set(domain).pop_first() else {
                break;
            };
            layout::encode_timer(buf, key_groups.of(&key), domain.id(), ts, &key, &ns);
            backend.delete(buf)?;
            out.push(Timer {
                timestamp: ts,
                key,
                namespace: ns,
                domain,
            });
        }
        Ok(out)
    }

    pub(crate) fn count(&mut self, domain: TimeDomain) -> usize {
        self.set(domain).len()
    }
}

/// What [`TimerIndex::change`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerChange {
    Register,
    Delete,
}

/// Where a timer of the current key lives: its key group, key and namespace, and a
/// scratch buffer for its storage key.
pub(crate) struct TimerAt<'a> {
    pub buf: &'a mut Vec<u8>,
    pub key_group: u32,
    pub key: &'a [u8],
    pub namespace: &'a [u8],
}
