//! Flink's `BufferingSink` (from the operator-state docs), on streamstate.
//!
//! Events are collected in memory and written as one record per `BATCH` events:
//! `{"batch": [<event>, ...]}`. The buffer is not keyed state: at every checkpoint
//! `snapshot_state` copies it into operator list state, and `open` — called at start and
//! after every restore — reloads it when `is_restored()`. A crash therefore loses
//! nothing and repeats nothing: the buffer comes back exactly as the checkpoint saw it,
//! and the input after the checkpoint is replayed on top.
//!
//! ```text
//! cargo run --release --example buffering_sink -- config/local.toml
//! ```

use serde_json::{Value, json};
use streamstate::config::Config;
use streamstate::function::*;
use streamstate_state::OperatorListState;

/// Events per output record; `BUFFERING_SINK_BATCH` overrides it.
fn batch_size() -> usize {
    std::env::var("BUFFERING_SINK_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(10)
}

struct BufferingSink {
    threshold: usize,
    buffer: Vec<Value>,
    checkpointed: Option<OperatorListState<String>>,
}

impl ProcessFunction for BufferingSink {
    fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
        let state = ctx.operator_list_state::<String>("buffered-elements")?;
        // Whatever the aborted or crashed epoch had buffered is gone; the checkpoint's
        // buffer is the truth.
        self.buffer.clear();
        if ctx.is_restored() {
            for element in state.get()? {
                self.buffer.push(serde_json::from_str(&element)?);
            }
            tracing::info!(
                restored = self.buffer.len(),
                "buffer restored from operator state"
            );
        }
        self.checkpointed = Some(state);
        Ok(())
    }

    fn process_element(
        &mut self,
        event: &Event<'_>,
        _: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        self.buffer.push(event.value.clone());
        if self.buffer.len() >= self.threshold {
            let batch = std::mem::take(&mut self.buffer);
            out.emit(event.key, &json!({"batch": batch}))?;
        }
        Ok(())
    }

    fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<(), FunctionError> {
        let state = self.checkpointed.as_ref().ok_or(FunctionError::NotOpen)?;
        let elements = self.buffer.iter().map(Value::to_string).collect::<Vec<_>>();
        Ok(state.update(&elements)?)
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: buffering_sink <config.toml>");
        std::process::exit(2);
    };
    let sink = BufferingSink {
        threshold: batch_size(),
        buffer: Vec::new(),
        checkpointed: None,
    };
    let result = Config::load(path.as_ref())
        .map_err(|e| e.to_string())
        .and_then(|config| {
            streamstate::service::run(config, Box::new(sink)).map_err(|e| e.to_string())
        });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
