//! How state values are stored: postcard (a stable, documented wire format) for every
//! value, and a JSON view of the same bytes for anyone who looks at state (the admin
//! API's state lookup, `checkpoints inspect`). Handles, operator state and the inspector
//! all encode and decode through here.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Result, StateError};

/// Bound for stored types: serde both ways, owned, and `Clone`, because the `hashmap`
/// backend keeps values as objects and a read hands out a copy (Flink's heap backend
/// copies through its serializer for the same reason).
pub trait StateValue: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> StateValue for T {}

/// Appends `v`'s postcard bytes to `buf`; errors name `state`.
pub(crate) fn ser_append<T: Serialize + ?Sized>(
    buf: &mut Vec<u8>,
    v: &T,
    state: &str,
) -> Result<()> {
    let taken = std::mem::take(buf);
    *buf = postcard::to_extend(v, taken).map_err(|e| StateError::Serde {
        state: state.to_string(),
        message: e.to_string(),
    })?;
    Ok(())
}

pub(crate) fn de<T: DeserializeOwned>(bytes: &[u8], state: &str) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| StateError::Serde {
        state: state.to_string(),
        message: e.to_string(),
    })
}

/// Decodes stored postcard bytes of one type into JSON.
pub type DecodeFn = fn(&[u8]) -> std::result::Result<Value, String>;

/// How to show a state's stored bytes: the value (or accumulator, or list
/// element) type and, for map state, the user-key type.
#[derive(Clone, Copy)]
pub struct JsonCodec {
    pub value: DecodeFn,
    pub map_key: Option<DecodeFn>,
}

/// postcard bytes of `T` → JSON through `T`'s own `Serialize`.
pub fn decode_json<T: StateValue>(bytes: &[u8]) -> std::result::Result<Value, String> {
    let v: T = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
    serde_json::to_value(&v).map_err(|e| e.to_string())
}
