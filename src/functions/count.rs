//! A running count per key: every event emits `{"key", "count", "source"}`.

use serde_json::json;
use streamstate_state::{StateDeclaration, ValueState, ValueStateDescriptor};

use crate::function::{Event, FunctionError, KeyedContext, OpenContext, Output, ProcessFunction};

/// The one keyed state: the number of events seen per key.
pub const STATE: &str = "count";

/// The descriptor `open` registers; [`Count::declared_states`] derives from it, so the
/// offline `check-restore` and the running job cannot disagree.
pub fn descriptor() -> ValueStateDescriptor<u64> {
    ValueStateDescriptor::new(STATE)
}

#[derive(Default)]
pub struct Count {
    count: Option<ValueState<u64>>,
}

impl ProcessFunction for Count {
    fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
        self.count = Some(ctx.value_state(&descriptor())?);
        Ok(())
    }

    fn process_element(
        &mut self,
        event: &Event<'_>,
        _: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let count = self.count.as_ref().ok_or(FunctionError::NotOpen)?;
        let n = count.value()?.unwrap_or(0) + 1;
        count.update(&n)?;
        out.emit(
            event.key,
            &json!({"key": event.key, "count": n, "source": event.source}),
        )
    }
}

impl Count {
    /// The states `open` registers, known without running the job.
    pub fn declared_states() -> Vec<StateDeclaration> {
        vec![descriptor().declaration()]
    }
}
