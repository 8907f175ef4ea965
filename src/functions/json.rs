//! Decode and re-encode, no state: every event is emitted as it was decoded, keyed by its
//! state key. The benchmark's `J` contender — the pass-through plus the cost of JSON and of
//! the driver's key scoping — so `J / P` prices parsing apart from state.

use crate::function::{Event, FunctionError, KeyedContext, OpenContext, Output, ProcessFunction};

#[derive(Default)]
pub struct Json;

impl ProcessFunction for Json {
    fn open(&mut self, _: &OpenContext<'_>) -> Result<(), FunctionError> {
        Ok(())
    }

    fn process_element(
        &mut self,
        event: &Event<'_>,
        _: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        out.emit(event.key, event.value)
    }
}
