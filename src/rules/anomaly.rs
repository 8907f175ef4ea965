//! `kind: "anomaly"`: a running mean and variance per key; an event whose z-score
//! exceeds the bound is emitted with the model's parameters.
//!
//! The event is scored against the model as it was *before* the event, then folded in
//! (anomalies update the model too). No output before `min_samples` events, nor while
//! the standard deviation is 0.
//!
//! - `welford`: exact mean and sample variance (`m2 / (n - 1)`) of every value seen.
//! - `ewma`: exponentially weighted mean and variance with factor `alpha`:
//!   `d = x - mean; mean += alpha * d; var = (1 - alpha) * (var + alpha * d^2)`,
//!   started at the first value (mean = x, var = 0).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::output::{Field, record};
use super::spec::{AnomalySpec, Model, Rule};
use super::window::{self, namespace};
use super::{Env, States};
use crate::function::{Event, FunctionError, Output};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelState {
    pub n: u64,
    pub mean: f64,
    /// ewma: the variance; welford: the sum of squared deviations (m2).
    pub spread: f64,
}

impl ModelState {
    pub fn stddev(&self, model: Model) -> f64 {
        match model {
            Model::Welford if self.n < 2 => 0.0,
            Model::Welford => (self.spread / (self.n - 1) as f64).sqrt(),
            Model::Ewma => self.spread.sqrt(),
        }
    }

    pub fn update(&mut self, model: Model, alpha: f64, x: f64) {
        if self.n == 0 {
            *self = Self {
                n: 1,
                mean: x,
                spread: 0.0,
            };
            return;
        }
        self.n += 1;
        let d = x - self.mean;
        match model {
            Model::Welford => {
                self.mean += d / self.n as f64;
                self.spread += d * (x - self.mean);
            }
            Model::Ewma => {
                self.mean += alpha * d;
                self.spread = (1.0 - alpha) * (self.spread + alpha * d * d);
            }
        }
    }
}

pub(crate) fn on_event(
    env: &Env<'_, '_>,
    st: &mut States,
    rule: &Rule,
    a: &AnomalySpec,
    ev: &Event<'_>,
    out: &mut Output,
) -> Result<(), FunctionError> {
    let x = match a.field.resolve(ev.value) {
        None => {
            env.eval_error("field_missing");
            return Ok(());
        }
        Some(v) => match v.as_f64().filter(|x| x.is_finite()) {
            Some(x) => x,
            None => {
                env.eval_error("not_a_number");
                return Ok(());
            }
        },
    };
    env.set_namespace(&namespace(&rule.id, rule.version, window::ANOMALY, None));
    let mut m = st.anomaly.value()?.unwrap_or_default();
    let before = m.clone();
    m.update(a.model, a.alpha, x);
    st.anomaly.update(&m)?;
    if before.n < a.min_samples {
        return Ok(());
    }
    let sd = before.stddev(a.model);
    if sd <= 0.0 {
        return Ok(());
    }
    let z = (x - before.mean) / sd;
    if z.abs() <= a.z_gt {
        return Ok(());
    }
    let model = match a.model {
        Model::Ewma => {
            json!({"model": "ewma", "alpha": a.alpha, "z_gt": a.z_gt, "min_samples": a.min_samples})
        }
        Model::Welford => json!({"model": "welford", "z_gt": a.z_gt, "min_samples": a.min_samples}),
    };
    let mut info = model;
    info["z"] = json!(z);
    info["mean"] = json!(before.mean);
    info["stddev"] = json!(sd);
    info["samples"] = json!(before.n);
    let value = ev
        .value
        .pointer(a.field.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    let r = record(
        rule,
        ev.key,
        value,
        None,
        Some(ev.source),
        ev.timestamp_ms,
        [("anomaly", Field::Value(info))],
    );
    env.emit(out, rule, ev.key, &r)
}
