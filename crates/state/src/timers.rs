//! Timers per key and namespace. They are stored in the backend (key group
//! first, so they move with their key on rescale and ride in every snapshot)
//! and mirrored in an in-memory time-ordered index so the runtime can ask
//! "what is due?" without a scan.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::backend::KvBackend;
use crate::error::Result;
use crate::layout::{self, TIMER_EVENT, TIMER_PROCESSING};
use crate::store::{Inner, StateStore};

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
}

impl Inner {
    /// Reloads the index from the backend (after a restore).
    pub(crate) fn rebuild_timer_index(&mut self) -> Result<()> {
        self.timers = TimerIndex::default();
        let range = self.config.key_group_range;
        for kg in range.start..=range.end {
            for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
                let mut start = (kg as u16).to_be_bytes().to_vec();
                start.extend_from_slice(&domain.id().to_be_bytes());
                let end = layout::prefix_end(&start);
                let mut found = Vec::new();
                self.backend.scan(&start, &end, &mut |k, _| {
                    found.push(k.to_vec());
                    true
                })?;
                for k in found {
                    let p = layout::decode_key(&k)?;
                    self.timers.set(domain).insert((
                        p.ts.unwrap_or(0),
                        p.key.to_vec(),
                        p.ns.to_vec(),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl StateStore {
    /// Registers a timer for the current key and namespace. Registering the
    /// same (time, key, namespace) twice leaves one timer.
    pub fn register_timer(&self, domain: TimeDomain, timestamp: u64) -> Result<()> {
        let mut g = self.lock();
        if !g.has_key {
            return Err(crate::StateError::NoCurrentKey);
        }
        let g = &mut *g;
        layout::encode_timer(&mut g.kbuf, g.kg, domain.id(), timestamp, &g.key, &g.ns);
        g.backend.put(&g.kbuf, &[])?;
        g.timers
            .set(domain)
            .insert((timestamp, g.key.clone(), g.ns.clone()));
        Ok(())
    }

    pub fn delete_timer(&self, domain: TimeDomain, timestamp: u64) -> Result<()> {
        let mut g = self.lock();
        if !g.has_key {
            return Err(crate::StateError::NoCurrentKey);
        }
        let g = &mut *g;
        layout::encode_timer(&mut g.kbuf, g.kg, domain.id(), timestamp, &g.key, &g.ns);
        g.backend.delete(&g.kbuf)?;
        g.timers
            .set(domain)
            .remove(&(timestamp, g.key.clone(), g.ns.clone()));
        Ok(())
    }

    pub fn register_event_time_timer(&self, timestamp: u64) -> Result<()> {
        self.register_timer(TimeDomain::EventTime, timestamp)
    }
    pub fn delete_event_time_timer(&self, timestamp: u64) -> Result<()> {
        self.delete_timer(TimeDomain::EventTime, timestamp)
    }
    pub fn register_processing_time_timer(&self, timestamp: u64) -> Result<()> {
        self.register_timer(TimeDomain::ProcessingTime, timestamp)
    }
    pub fn delete_processing_time_timer(&self, timestamp: u64) -> Result<()> {
        self.delete_timer(TimeDomain::ProcessingTime, timestamp)
    }

    /// The earliest registered timer of `domain`.
    pub fn next_timer(&self, domain: TimeDomain) -> Option<u64> {
        self.lock().timers.set(domain).first().map(|e| e.0)
    }

    /// Removes and returns every timer with `timestamp <= up_to`, in time
    /// order (ties by key, then namespace). Timers registered while firing
    /// are returned by the next call.
    pub fn pop_due_timers(&self, domain: TimeDomain, up_to: u64) -> Result<Vec<Timer>> {
        let mut g = self.lock();
        let g = &mut *g;
        let mut out = Vec::new();
        while let Some(first) = g.timers.set(domain).first() {
            if first.0 > up_to {
                break;
            }
            let Some((ts, key, ns)) = g.timers.set(domain).pop_first() else {
                break;
            };
            let kg = g.key_groups.of(&key);
            layout::encode_timer(&mut g.kbuf, kg, domain.id(), ts, &key, &ns);
            g.backend.delete(&g.kbuf)?;
            out.push(Timer {
                timestamp: ts,
                key,
                namespace: ns,
                domain,
            });
        }
        Ok(out)
    }

    /// Number of registered timers of `domain`.
    pub fn timer_count(&self, domain: TimeDomain) -> usize {
        self.lock().timers.set(domain).len()
    }
}
