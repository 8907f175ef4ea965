//! The rule parser on arbitrary bytes: `spec::compile` on any JSON value, and the
//! control-record envelope (`Rules::prepare`: key + payload) on a real broadcast state.
#![no_main]
use libfuzzer_sys::fuzz_target;
use streamstate::control::Rules;
use streamstate::state::{BackendKind, StateStore, StoreConfig};

thread_local! {
    static RULES: (tempfile::TempDir, StateStore) = {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::open(StoreConfig::new(BackendKind::Hashmap, dir.path().join("s"), 4)).expect("store");
        (dir, store)
    };
}

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = streamstate::rules::spec::compile(&value);
    }
    // First byte splits the input into record key and payload.
    let split = data.first().map_or(0, |b| (*b as usize).min(data.len().saturating_sub(1)));
    let (key, payload) = if data.is_empty() { (&data[..], &data[..]) } else { data[1..].split_at(split.min(data.len() - 1)) };
    RULES.with(|(_, store)| {
        let rules = Rules::new(store, Default::default());
        let _ = rules.prepare(Some(key), Some(payload), 0, 1, 1_700_000_000_000).expect("state layer");
        let _ = rules.prepare(None, Some(data), 0, 2, 1_700_000_000_000).expect("state layer");
    });
});
