//! The built-in rule engine: JSON rules from the control topic, applied per key.
//!
//! Work in progress: this skeleton refuses every rule so that nothing half-built is ever
//! put in force.

use crate::config::Config;
use crate::function::{BroadcastContext, BroadcastUpdate, Event, FunctionError, KeyedContext, OpenContext, Output, ProcessFunction};
use crate::metrics::Metrics;

pub struct RuleEngine {
    _metrics: Metrics,
}

impl RuleEngine {
    pub fn new(_config: &Config, metrics: Metrics) -> Self {
        Self { _metrics: metrics }
    }
}

impl ProcessFunction for RuleEngine {
    fn open(&mut self, _: &OpenContext<'_>) -> Result<(), FunctionError> {
        Ok(())
    }
    fn process_element(&mut self, _: &Event<'_>, _: &KeyedContext<'_>, _: &mut Output) -> Result<(), FunctionError> {
        Ok(())
    }
    fn process_broadcast_element(&mut self, u: &BroadcastUpdate<'_>, _: &BroadcastContext<'_>, out: &mut Output) -> Result<(), FunctionError> {
        if u.body.is_some() {
            out.reject("rule_unsupported", "the rule engine is not built yet");
        }
        Ok(())
    }
}
