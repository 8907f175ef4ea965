//! Requests from the admin server to the job loop.
//!
//! The admin server never touches state, Kafka or the transaction itself: anything that
//! needs the job goes through a small bounded channel that the loop drains between
//! polls, and the answer comes back on a oneshot. A full channel is answered `503` at
//! once, so a flood of requests cannot queue up behind the job; a slow HTTP client only
//! delays its own reply, never the loop.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use serde_json::Value;
use tokio::sync::oneshot;

use crate::history::{CheckpointRecord, SavepointRecord};
use crate::savepoint::SavepointTarget;

/// Requests waiting for the loop; more are refused (`503`).
pub const CAPACITY: usize = 8;

pub type Reply<T> = oneshot::Sender<Result<T, String>>;

pub enum Request {
    /// Take a checkpoint now (`POST /checkpoints`).
    Checkpoint { reply: Reply<CheckpointRecord> },
    /// Checkpoint, then write a savepoint with the same offsets (`POST /savepoints`).
    Savepoint {
        target: Option<SavepointTarget>,
        reply: Reply<SavepointRecord>,
    },
    /// Stop polling, take the final checkpoint (and a savepoint), exit 0 (`POST /stop`).
    Stop {
        savepoint: bool,
        reply: Reply<Option<SavepointRecord>>,
    },
    /// One key's state (`GET /state/{key}`).
    State {
        key: String,
        reply: Reply<StateAnswer>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum StateAnswer {
    Found(Value),
    NotFound,
    /// Another instance owns the key's key group.
    NotOwned {
        key_group: u32,
        owner: u32,
    },
}

/// Both ends; the job takes the receiver once at start.
pub struct Requests {
    tx: SyncSender<Request>,
    rx: Mutex<Option<Receiver<Request>>>,
}

impl Default for Requests {
    fn default() -> Self {
        let (tx, rx) = sync_channel(CAPACITY);
        Self {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// The channel is full: the loop is busy (a long checkpoint, or a flood).
    Busy,
    /// The job loop has ended.
    Gone,
}

impl Requests {
    pub fn send(&self, r: Request) -> Result<(), SendError> {
        self.tx.try_send(r).map_err(|e| match e {
            TrySendError::Full(_) => SendError::Busy,
            TrySendError::Disconnected(_) => SendError::Gone,
        })
    }

    /// The loop's end; `None` after the first call.
    pub fn take_receiver(&self) -> Option<Receiver<Request>> {
        self.rx.lock().ok()?.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_channel_is_busy_and_a_dropped_receiver_is_gone() {
        let r = Requests::default();
        let rx = r.take_receiver().expect("receiver");
        assert!(r.take_receiver().is_none());
        for _ in 0..CAPACITY {
            let (tx, _rx) = oneshot::channel();
            r.send(Request::Checkpoint { reply: tx }).expect("room");
        }
        let (tx, _rx) = oneshot::channel();
        assert_eq!(
            r.send(Request::Checkpoint { reply: tx }).err(),
            Some(SendError::Busy)
        );
        drop(rx);
        let (tx, _rx) = oneshot::channel();
        assert_eq!(
            r.send(Request::Checkpoint { reply: tx }).err(),
            Some(SendError::Gone)
        );
    }
}
