//! The behaviour-pattern detector from Flink's broadcast-state article, on streamstate.
//!
//! Events `{"user_id": "u1", "action": "login"}` are keyed by user; each user's previous
//! action lives in keyed `ValueState`. Patterns arrive on the control topic
//! (`{"id": "login-pay", "version": 1, "first": "login", "second": "pay"}`) and live in
//! broadcast state, so every instance knows every pattern. When a user's previous and
//! current actions match a pattern, the detector emits
//! `{"user_id", "pattern", "first", "second", "source"}`.
//!
//! ```text
//! cargo run --release --example pattern_detector -- config/local.toml
//! ```

use serde::{Deserialize, Serialize};
use serde_json::json;
use streamstate::config::Config;
use streamstate::function::*;
use streamstate_state::{MapStateDescriptor, ValueState, ValueStateDescriptor};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Pattern {
    first: String,
    second: String,
}

fn patterns() -> MapStateDescriptor<String, Pattern> {
    MapStateDescriptor::new("patterns")
}

#[derive(Default)]
struct PatternDetector {
    previous_action: Option<ValueState<String>>,
}

impl ProcessFunction for PatternDetector {
    fn open(&mut self, ctx: &OpenContext<'_>) -> Result<(), FunctionError> {
        self.previous_action =
            Some(ctx.value_state(&ValueStateDescriptor::new("previous-action"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        event: &Event<'_>,
        ctx: &KeyedContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let previous = self
            .previous_action
            .as_ref()
            .ok_or(FunctionError::NotOpen)?;
        let Some(action) = event.value.get("action").and_then(|a| a.as_str()) else {
            out.reject("no_action", "event has no string field `action`");
            return Ok(());
        };
        if let Some(last) = previous.value()? {
            // Read-only on this side: the keyed side cannot change the patterns.
            for (id, p) in ctx.broadcast_state(&patterns()).entries()? {
                if p.first == last && p.second == action {
                    out.emit(
                        event.key,
                        &json!({"user_id": event.key, "pattern": id, "first": p.first, "second": p.second, "source": event.source}),
                    )?;
                }
            }
        }
        previous.update(&action.to_string())?;
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        update: &BroadcastUpdate<'_>,
        ctx: &BroadcastContext<'_>,
        out: &mut Output,
    ) -> Result<(), FunctionError> {
        let state = ctx.broadcast_state(&patterns());
        let Some(body) = update.body else {
            return Ok(state.remove(&update.id.to_string())?);
        };
        let first = body.get("first").and_then(|v| v.as_str());
        let second = body.get("second").and_then(|v| v.as_str());
        match (first, second) {
            (Some(first), Some(second)) => state.put(
                &update.id.to_string(),
                &Pattern {
                    first: first.into(),
                    second: second.into(),
                },
            )?,
            _ => out.reject(
                "pattern_invalid",
                "a pattern needs string fields `first` and `second`",
            ),
        }
        Ok(())
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: pattern_detector <config.toml>");
        std::process::exit(2);
    };
    let result = Config::load(path.as_ref())
        .map_err(|e| e.to_string())
        .and_then(|config| {
            streamstate::service::run(config, Box::new(PatternDetector::default()))
                .map_err(|e| e.to_string())
        });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
