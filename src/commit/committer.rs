//! The committer thread: one epoch at a time, in the order they were sealed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use tracing::warn;

use super::{CommitError, Committed, EpochError, Housekeeping, Outcome, Slot, Work, classify};
use crate::checkpoint::CheckpointStorage;

pub(super) fn run<S: Slot>(
    storage: Arc<dyn CheckpointStorage>,
    housekeeping: Housekeeping,
    work: Receiver<Work<S>>,
    outcomes: Sender<Outcome>,
    written: &AtomicU64,
) {
    // The generation that failed: its later epochs are aborted, never committed.
    let mut failed: Option<u64> = None;
    for mut w in work {
        // Counts this epoch's full snapshot as written once it is, or as soon as it
        // never will be (a failure, an abort).
        let mut snapshot = Written {
            count: written,
            done: !w.full_snapshot(),
        };
        let outcome = if failed == Some(w.generation) {
            remove_staging(&w);
            match w.slot.abort() {
                Ok(()) => Outcome::Aborted,
                Err(e) => Outcome::Fatal(CommitError::Sink(e)),
            }
        } else {
            match commit(storage.as_ref(), &housekeeping, &mut w, &mut snapshot) {
                Ok(c) => Outcome::Committed(c),
                Err(cause) => {
                    remove_staging(&w);
                    match classify(w.checkpoint.clone(), cause) {
                        EpochError::Failed { checkpoint, cause } => {
                            failed = Some(w.generation);
                            match w.slot.abort() {
                                Ok(()) => Outcome::Failed { checkpoint, cause },
                                Err(e) => Outcome::Fatal(CommitError::Sink(e)),
                            }
                        }
                        EpochError::Fatal(cause) => Outcome::Fatal(cause),
                        EpochError::CommitterGone => return,
                    }
                }
            }
        };
        snapshot.mark();
        let fatal = matches!(outcome, Outcome::Fatal(_));
        if outcomes.send(outcome).is_err() || fatal {
            return;
        }
    }
}

/// One epoch's part of [`super::Epochs::writing_full_snapshot`]'s count.
struct Written<'a> {
    count: &'a AtomicU64,
    done: bool,
}

impl Written<'_> {
    fn mark(&mut self) {
        if !self.done {
            self.done = true;
            self.count.fetch_add(1, Ordering::Release);
        }
    }
}

/// Steps 2–4 of the protocol for one epoch: durable snapshot, offsets into the
/// transaction, commit; then mark complete and prune.
fn commit<S: Slot>(
    storage: &dyn CheckpointStorage,
    housekeeping: &Housekeeping,
    w: &mut Work<S>,
    snapshot: &mut Written<'_>,
) -> Result<Committed, CommitError> {
    let started = Instant::now();
    let sealed = &mut w.sealed;
    if let Some(rest) = sealed.rest.take() {
        rest.complete(&mut sealed.manifest.state)?;
    }
    let materialized = Instant::now();
    // Written: the next barrier may freeze the state while this one uploads.
    snapshot.mark();
    crate::crash_point!("during-upload");
    let written = storage.write(&sealed.manifest, &sealed.staging)?;
    remove_dir(&sealed.staging)?;
    let uploaded = Instant::now();
    crate::crash_point!("after-snapshot");
    // The epoch's records were sealed still queued; a delivery that failed fails the commit.
    w.slot.flush()?;
    w.slot.send_offsets(&sealed.offsets, &w.checkpoint)?;
    crate::crash_point!("before-commit");
    w.slot.commit()?;
    let committed = Instant::now();
    crate::crash_point!("after-commit");
    // After the commit the checkpoint is the state whatever happens here: marking and
    // pruning only tidy storage (restore marks the committed one complete), so a failure
    // is logged and retried by the next checkpoint's prune.
    if let Err(e) = storage
        .mark_complete(&w.checkpoint)
        .and_then(|()| storage.prune(housekeeping.retained, &w.checkpoint))
    {
        warn!(checkpoint = %w.checkpoint, error = %e, "checkpoint committed but not marked complete or pruned");
    }
    Ok(Committed {
        manifest: sealed.manifest.clone(),
        written,
        barrier_at: sealed.barrier_at,
        materialize: materialized - started,
        upload: uploaded - started,
        commit: committed - uploaded,
    })
}

fn remove_staging<S>(w: &Work<S>) {
    if let Err(e) = remove_dir(&w.sealed.staging) {
        warn!(checkpoint = %w.checkpoint, error = %e, "could not remove the local snapshot");
    }
}

fn remove_dir(path: &std::path::Path) -> Result<(), CommitError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CommitError::Staging {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}
