//! Reading one key's state as JSON, for operators (the admin API's state lookup).
//!
//! Stored bytes are postcard and carry no type, so each handle registration
//! leaves a decoder built from the descriptor's serde type ([`JsonCodec`]).
//! [`StateStore::key_state_json`] then walks every registered state for one
//! key — all namespaces, every map entry and list element — and decodes what
//! it finds. A state restored from a snapshot but not (yet) registered by any
//! handle has no decoder; its entries are shown as hex.
//!
//! The walk is read-only: it neither cleans up expired entries nor refreshes
//! TTL timestamps (`OnReadAndWrite`), so looking at state never changes it.
//! Expired entries are left out under `NeverReturnExpired` and shown with
//! `"expired": true` under `ReturnExpiredIfNotCleanedUp`.

use serde_json::{Map, Value, json};

use crate::backend::KvBackend;
use crate::codec::{DecodeFn, JsonCodec};
use crate::error::{Result, StateError};
use crate::kind::StateKind;
use crate::layout;
use crate::store::StateStore;
use crate::ttl::{OnRead, TS_LEN, read_ts};

fn show(decode: Option<DecodeFn>, bytes: &[u8]) -> Value {
    match decode.map(|d| d(bytes)) {
        Some(Ok(v)) => v,
        Some(Err(e)) => json!({ "undecodable_hex": hex::encode(bytes), "error": e }),
        None => json!({ "hex": hex::encode(bytes) }),
    }
}

fn namespace(ns: &[u8]) -> Value {
    match std::str::from_utf8(ns) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => json!({ "hex": hex::encode(ns) }),
    }
}

impl StateStore {
    pub(crate) fn register_codec(&self, name: &str, codec: JsonCodec) {
        self.lock().decoders.insert(name.to_string(), codec);
    }

    /// Every keyed state entry of `key`, decoded, under one lock (so the view
    /// is consistent: no record is half-applied in it). `None` when the key
    /// has no state at all. Errors when `key` is outside this store's
    /// key-group range: ask the owner (see [`crate::KeyGroupRange::for_instance`]).
    ///
    /// Shape: `{"key_group": n, "states": {name: {"kind", "ttl_ms", "entries":
    /// [{"namespace", ["map_key"|"index"], "value", "expires_at_ms", ["expired"]}]}}}`.
    /// `expires_at_ms` is the processing time (ms since the epoch) at which the
    /// entry expires unless written (or, with `OnReadAndWrite`, read) again;
    /// `null` for states without TTL.
    pub fn key_state_json(&self, key: &[u8]) -> Result<Option<Value>> {
        let mut g = self.lock();
        let kg = g.key_groups.of(key);
        if !g.config.key_group_range.contains(kg) {
            return Err(StateError::Invalid(format!(
                "key {} is in key group {kg}, outside this instance's range {}",
                hex::encode(key),
                g.config.key_group_range
            )));
        }
        let now = g.now();
        let mut metas: Vec<_> = g.by_id.values().cloned().collect();
        metas.sort_by(|a, b| a.name.cmp(&b.name));
        let mut states = Map::new();
        for meta in metas {
            let mut prefix = Vec::with_capacity(8 + key.len());
            prefix.extend_from_slice(&(kg as u16).to_be_bytes());
            prefix.extend_from_slice(&meta.id.to_be_bytes());
            layout::put_varint(&mut prefix, key.len() as u64);
            prefix.extend_from_slice(key);
            let end = layout::prefix_end(&prefix);
            let mut raw: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            g.backend.scan(&prefix, &end, &mut |k, v| {
                raw.push((k.to_vec(), v.to_vec()));
                true
            })?;
            if raw.is_empty() {
                continue;
            }
            let codec = g.decoders.get(&meta.name).copied();
            let malformed =
                || StateError::Invalid(format!("state '{}': malformed storage key", meta.name));
            let mut entries = Vec::new();
            // One stored payload (with its TTL timestamp when the state has TTL)
            // → (value bytes, expires_at, expired), or None when it must stay hidden.
            let ttl_view = |stored: &[u8]| -> Result<Option<(Vec<u8>, Value, bool)>> {
                let Some(ttl) = &meta.ttl else {
                    return Ok(Some((stored.to_vec(), Value::Null, false)));
                };
                let ts = read_ts(stored).ok_or_else(|| {
                    StateError::Invalid(format!(
                        "state '{}': value without TTL timestamp",
                        meta.name
                    ))
                })?;
                // What a read would return, without the read's cleanup or refresh.
                let expired = match ttl.on_read(ts, now, false) {
                    OnRead::Expired { visible: false } => return Ok(None),
                    OnRead::Expired { visible: true } => true,
                    OnRead::Live { .. } => false,
                };
                Ok(Some((
                    stored[TS_LEN..].to_vec(),
                    json!(ts.saturating_add(ttl.ttl_ms)),
                    expired,
                )))
            };
            for (k, v) in &raw {
                let rest = &k[prefix.len()..];
                let (ns_len, n) = layout::get_varint(rest).ok_or_else(malformed)?;
                let ns = rest.get(n..n + ns_len as usize).ok_or_else(malformed)?;
                let user_key = &rest[n + ns_len as usize..];
                let mut push = |extra: Option<(&str, Value)>, stored: &[u8]| -> Result<()> {
                    let Some((bytes, expires_at, expired)) = ttl_view(stored)? else {
                        return Ok(());
                    };
                    let mut e = Map::new();
                    e.insert("namespace".into(), namespace(ns));
                    if let Some((name, v)) = extra {
                        e.insert(name.into(), v);
                    }
                    e.insert("value".into(), show(codec.map(|c| c.value), &bytes));
                    e.insert("expires_at_ms".into(), expires_at);
                    if expired {
                        e.insert("expired".into(), Value::Bool(true));
                    }
                    entries.push(Value::Object(e));
                    Ok(())
                };
                match meta.kind {
                    StateKind::List => {
                        for (i, element) in layout::list_elements(v)?.into_iter().enumerate() {
                            push(Some(("index", json!(i))), element)?;
                        }
                    }
                    StateKind::Map => push(
                        Some(("map_key", show(codec.and_then(|c| c.map_key), user_key))),
                        v,
                    )?,
                    _ => push(None, v)?,
                }
            }
            if entries.is_empty() {
                continue;
            }
            states.insert(
                meta.name.clone(),
                json!({
                    "kind": meta.kind,
                    "ttl_ms": meta.ttl.as_ref().map(|t| t.ttl_ms),
                    "entries": entries,
                }),
            );
        }
        if states.is_empty() {
            return Ok(None);
        }
        Ok(Some(json!({ "key_group": kg, "states": states })))
    }
}
