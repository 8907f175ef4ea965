//! Bytes in, bytes out: each input record's key and value go to the output topic unchanged,
//! without decoding. The benchmark's `P` contender, the physical limit of this stack: the
//! same consumer, transactions, checkpoints and commit protocol as every other function,
//! and no per-record work beyond them.
//!
//! The job loop short-cuts `[job] function = "passthrough"` before decoding (there is no
//! event to hand a function), so [`Passthrough`] only exists to be opened: it is never
//! called with an element. Nothing is dead-lettered: no record is inspected.

use crate::function::{Event, FunctionError, KeyedContext, OpenContext, Output, ProcessFunction};

#[derive(Default)]
pub struct Passthrough;

impl ProcessFunction for Passthrough {
    fn open(&mut self, _: &OpenContext<'_>) -> Result<(), FunctionError> {
        Ok(())
    }

    fn process_element(
        &mut self,
        _: &Event<'_>,
        _: &KeyedContext<'_>,
        _: &mut Output,
    ) -> Result<(), FunctionError> {
        Err(FunctionError::Other(
            "passthrough records are copied by the job loop, not processed".into(),
        ))
    }
}
