//! Typed JSON for exported values, where the binary knows the type.
//!
//! Snapshots hold postcard bytes, which are not self-describing, and the offline tools
//! have no descriptors. So the export always carries the raw bytes (hex), and adds a typed
//! `value` only for states this registry knows: entries keyed by state name, supplied by
//! the binary's built-in jobs. A codec is used only when the snapshot's recorded schema
//! names the same Rust type (or records none), so a state that changed type is never
//! decoded with the wrong codec.
//!
//! To add one: put `(state name, codec::<T>())` in [`for_function`]'s list for the job.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use streamstate_state::SchemaMeta;

use crate::config::FunctionKind;

#[derive(Clone, Copy)]
pub struct Codec {
    /// `std::any::type_name` of the type, as recorded in snapshot schemas.
    pub value_type: &'static str,
    pub decode: fn(&[u8]) -> Result<Value, String>,
    pub encode: fn(&Value) -> Result<Vec<u8>, String>,
}

fn decode<T: DeserializeOwned + Serialize>(b: &[u8]) -> Result<Value, String> {
    let v: T = postcard::from_bytes(b).map_err(|e| e.to_string())?;
    serde_json::to_value(v).map_err(|e| e.to_string())
}

fn encode<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Vec<u8>, String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    postcard::to_allocvec(&t).map_err(|e| e.to_string())
}

/// The codec of a postcard-encoded `T`.
pub fn codec<T: DeserializeOwned + Serialize>() -> Codec {
    Codec {
        value_type: std::any::type_name::<T>(),
        decode: decode::<T>,
        encode: encode::<T>,
    }
}

/// Codecs of `job`'s states, by state name.
pub fn for_function(job: FunctionKind) -> Registry {
    let list: Vec<(&str, Codec)> = match job {
        FunctionKind::Count => vec![(crate::functions::count::STATE, codec::<u64>())],
        FunctionKind::Rules | FunctionKind::Json | FunctionKind::Passthrough => vec![],
    };
    Registry(list.into_iter().map(|(n, c)| (n.to_string(), c)).collect())
}

#[derive(Clone, Default)]
pub struct Registry(pub BTreeMap<String, Codec>);

impl Registry {
    /// The codec for `state`, if known and matching the recorded schema.
    pub fn get(&self, state: &str, schema: Option<&SchemaMeta>) -> Option<Codec> {
        let c = self.0.get(state)?;
        schema
            .is_none_or(|s| s.value_type == c.value_type)
            .then_some(*c)
    }
}
