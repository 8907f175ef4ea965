//! A key's records stay in order across a barrier, and the job thread does not wait for
//! the broker to keep them so.
//!
//! Epoch `e+1` writes through another producer of the pool than epoch `e`. Two producers
//! are two connections: records that `e+1` sends while `e`'s are still queued could reach
//! a partition first and reorder a key across the barrier. Flushing `e`'s producer at the
//! barrier would prevent that at the price of a broker round trip in the job thread's
//! pause (Flink's KafkaSink pays it). Here `e+1`'s records are held in memory instead
//! while the producer ahead still has records queued, and go to `e+1`'s producer, in
//! order, as soon as it has none: usually a few milliseconds after the barrier.
//!
//! Only a seal can wait: `e+1` cannot be handed to the committer with records still held,
//! nor while `e`'s are undelivered (the epoch after it would no longer know to wait for
//! them), so [`Handover::release`] waits for the producer ahead when it has to. That
//! happens when `e`'s delivery takes longer than a whole checkpoint interval.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Slot;
use crate::sink::SinkError;

/// Records of the open epoch held back behind the previous epoch's producer.
pub struct Handover<S, R> {
    /// The previous epoch's producer, until it has nothing queued.
    ahead: Option<Arc<S>>,
    held: VecDeque<R>,
}

impl<S: Slot, R> Default for Handover<S, R> {
    fn default() -> Self {
        Self {
            ahead: None,
            held: VecDeque::new(),
        }
    }
}

impl<S: Slot, R> Handover<S, R> {
    /// The open epoch now writes through another producer than `previous`, whose
    /// records may still be on their way.
    pub fn follow(&mut self, previous: Arc<S>) {
        debug_assert!(self.held.is_empty(), "released at the seal or discarded");
        self.ahead = Some(previous);
    }

    /// Whether the caller may send a record straight to the open epoch's producer: true
    /// once nothing is queued ahead of it, after the held records went out through `send`
    /// in order. False: the caller must [`Handover::hold`] the record.
    pub fn ready(
        &mut self,
        send: impl FnMut(R) -> Result<(), SinkError>,
    ) -> Result<bool, SinkError> {
        if let Some(ahead) = &self.ahead {
            if ahead.queued() > 0 {
                return Ok(false);
            }
            self.ahead = None;
        }
        self.held.drain(..).try_for_each(send)?;
        Ok(true)
    }

    /// Keeps `record` until the producer ahead has delivered.
    pub fn hold(&mut self, record: R) {
        self.held.push_back(record);
    }

    /// At the seal: waits for the producer ahead if it still has records queued (its
    /// flush), then sends what is held. Afterwards every record of the epoch is with its
    /// own producer and nothing is ahead of it.
    pub fn release(
        &mut self,
        send: impl FnMut(R) -> Result<(), SinkError>,
    ) -> Result<(), SinkError> {
        if let Some(ahead) = self.ahead.take()
            && ahead.queued() > 0
            && let Err(e) = ahead.flush()
        {
            self.ahead = Some(ahead);
            return Err(e);
        }
        self.held.drain(..).try_for_each(send)
    }

    /// A rewind: the held records belonged to the aborted epoch. The epochs ahead were
    /// settled (committed or aborted) before it, so nothing is queued ahead any more.
    pub fn discard(&mut self) {
        self.held.clear();
        self.ahead = None;
    }

    /// Records held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::checkpoint::CheckpointRef;
    use crate::source::Offsets;

    /// A producer whose queue the test empties by hand.
    #[derive(Default)]
    struct Queue {
        queued: AtomicUsize,
        flushes: AtomicUsize,
        fail_flush: Mutex<bool>,
    }

    impl Slot for Queue {
        fn begin(&self, _: &CheckpointRef) -> Result<(), SinkError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), SinkError> {
            self.flushes.fetch_add(1, Ordering::SeqCst);
            if *self.fail_flush.lock().expect("lock") {
                return Err(SinkError::NoGroupMetadata);
            }
            self.queued.store(0, Ordering::SeqCst);
            Ok(())
        }
        fn queued(&self) -> usize {
            self.queued.load(Ordering::SeqCst)
        }
        fn send_offsets(&self, _: &Offsets, _: &CheckpointRef) -> Result<(), SinkError> {
            Ok(())
        }
        fn commit(&self) -> Result<(), SinkError> {
            Ok(())
        }
        fn abort(&self) -> Result<(), SinkError> {
            Ok(())
        }
    }

    /// Sends `r` through the handover the way the sink does, into `sent`.
    fn send(h: &mut Handover<Queue, u32>, sent: &mut Vec<u32>, r: u32) {
        let ready = h
            .ready(|x| {
                sent.push(x);
                Ok(())
            })
            .expect("ready");
        if ready {
            sent.push(r);
        } else {
            h.hold(r);
        }
    }

    #[test]
    fn records_wait_while_the_previous_producer_has_records_queued_then_go_in_order() {
        let ahead = Arc::new(Queue::default());
        ahead.queued.store(3, Ordering::SeqCst);
        let mut h = Handover::default();
        h.follow(ahead.clone());
        let mut sent = Vec::new();
        for r in 1..=3 {
            send(&mut h, &mut sent, r);
        }
        assert!(sent.is_empty(), "nothing overtakes the previous epoch");
        assert_eq!(h.held(), 3);
        ahead.queued.store(0, Ordering::SeqCst);
        send(&mut h, &mut sent, 4);
        assert_eq!(sent, vec![1, 2, 3, 4]);
        assert_eq!(h.held(), 0);
        assert_eq!(
            ahead.flushes.load(Ordering::SeqCst),
            0,
            "the job thread never waited"
        );
    }

    #[test]
    fn the_seal_waits_for_the_previous_producer_only_when_it_still_has_records_queued() {
        let ahead = Arc::new(Queue::default());
        ahead.queued.store(1, Ordering::SeqCst);
        let mut h = Handover::default();
        h.follow(ahead.clone());
        let mut sent = Vec::new();
        send(&mut h, &mut sent, 1);
        h.release(|x| {
            sent.push(x);
            Ok(())
        })
        .expect("release");
        assert_eq!(sent, vec![1]);
        assert_eq!(ahead.flushes.load(Ordering::SeqCst), 1);

        // Delivered before the seal: no wait.
        let ahead = Arc::new(Queue::default());
        h.follow(ahead.clone());
        h.release(|_| Ok(())).expect("release");
        assert_eq!(ahead.flushes.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_epoch_that_sent_nothing_still_waits_at_its_seal_for_the_one_ahead() {
        // Epoch e+1 held nothing, but e's records are still queued: if e+1 were sealed
        // without waiting, e+2 would follow e+1's empty producer and could overtake e.
        let ahead = Arc::new(Queue::default());
        ahead.queued.store(2, Ordering::SeqCst);
        let mut h: Handover<Queue, u32> = Handover::default();
        h.follow(ahead.clone());
        h.release(|_| Ok(())).expect("release");
        assert_eq!(ahead.flushes.load(Ordering::SeqCst), 1);
        assert_eq!(ahead.queued(), 0);
    }

    #[test]
    fn a_failed_wait_at_the_seal_keeps_the_records_for_the_abort() {
        let ahead = Arc::new(Queue::default());
        ahead.queued.store(1, Ordering::SeqCst);
        *ahead.fail_flush.lock().expect("lock") = true;
        let mut h = Handover::default();
        h.follow(ahead.clone());
        let mut sent = Vec::new();
        send(&mut h, &mut sent, 7);
        assert!(h.release(|_| panic!("nothing is sent")).is_err());
        assert_eq!(h.held(), 1);
        h.discard();
        assert_eq!(h.held(), 0);
        assert!(
            h.ready(|_| Ok(())).expect("ready"),
            "nothing ahead after a rewind"
        );
        assert!(sent.is_empty());
    }
}
