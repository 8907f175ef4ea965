//! `StateStore::key_state_json`: one key's state, every kind, decoded to JSON with TTL
//! expiry per entry, identical on both backends and after a restore.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use streamstate_state::*;

const START: u64 = 1_000_000;

fn fill(store: &StateStore) {
    let count = store
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .expect("value");
    let seen = store
        .list_state(
            &ListStateDescriptor::<String>::new("seen")
                .with_ttl(TtlConfig::new(Duration::from_millis(100))),
        )
        .expect("list");
    let totals = store
        .map_state(&MapStateDescriptor::<String, i64>::new("totals"))
        .expect("map");
    let sum = store
        .reducing_state(&ReducingStateDescriptor::<u64>::new("sum", |a, b| a + b))
        .expect("reducing");
    store.set_current_key(b"user-1").expect("key");
    count.update(&3).expect("update");
    seen.add(&"a".to_string()).expect("add");
    totals.put(&"eur".to_string(), &12).expect("put");
    totals.put(&"usd".to_string(), &-4).expect("put");
    sum.add(&5).expect("add");
    store.set_current_namespace(b"w1");
    sum.add(&7).expect("add");
    store.set_current_namespace(b"");
    store.set_current_key(b"user-2").expect("key");
    count.update(&9).expect("update");
}

fn expected_user_1(seen_entries: Value) -> Value {
    json!({
        "count": {"kind": "value", "ttl_ms": null, "entries": [
            {"namespace": "", "value": 3, "expires_at_ms": null}]},
        "seen": {"kind": "list", "ttl_ms": 100, "entries": seen_entries},
        "sum": {"kind": "reducing", "ttl_ms": null, "entries": [
            {"namespace": "", "value": 5, "expires_at_ms": null},
            {"namespace": "w1", "value": 7, "expires_at_ms": null}]},
        "totals": {"kind": "map", "ttl_ms": null, "entries": [
            {"namespace": "", "map_key": "eur", "value": 12, "expires_at_ms": null},
            {"namespace": "", "map_key": "usd", "value": -4, "expires_at_ms": null}]},
    })
}

fn every_state_of_a_key_is_decoded_with_its_expiry(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    fill(&store);
    let got = store
        .key_state_json(b"user-1")
        .expect("lookup")
        .expect("user-1 has state");
    let seen = json!([{"namespace": "", "index": 0, "value": "a", "expires_at_ms": START + 100}]);
    assert_eq!(got["states"], expected_user_1(seen), "{got:#}");
    assert_eq!(got["key_group"], json!(key_group_for(b"user-1", 128)));
    let two = store
        .key_state_json(b"user-2")
        .expect("lookup")
        .expect("user-2 has state");
    assert_eq!(
        two["states"].as_object().map(|o| o.len()),
        Some(1),
        "{two:#}"
    );
    assert_eq!(store.key_state_json(b"nobody").expect("lookup"), None);
}

fn expired_entries_are_hidden_and_the_lookup_changes_nothing(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    fill(&store);
    env.clock.advance(150);
    let got = store
        .key_state_json(b"user-1")
        .expect("lookup")
        .expect("state");
    assert!(
        got["states"].get("seen").is_none(),
        "expired list element must not show: {got:#}"
    );
    // Looking did not clean up: a ReturnExpiredIfNotCleanedUp view of the same data still
    // sees the element, marked expired.
    let lenient = store
        .list_state(
            &ListStateDescriptor::<String>::new("seen").with_ttl(
                TtlConfig::new(Duration::from_millis(100))
                    .visibility(StateVisibility::ReturnExpiredIfNotCleanedUp),
            ),
        )
        .expect("re-register");
    let got = store
        .key_state_json(b"user-1")
        .expect("lookup")
        .expect("state");
    assert_eq!(
        got["states"]["seen"]["entries"],
        json!([{"namespace": "", "index": 0, "value": "a", "expires_at_ms": START + 100, "expired": true}])
    );
    store.set_current_key(b"user-1").expect("key");
    assert_eq!(lenient.get().expect("get"), vec!["a".to_string()]);
    assert!(
        store.ttl_expired_total() >= 1,
        "the read above removed the expired element"
    );
}

fn keys_of_other_instances_are_refused(kind: BackendKind) {
    let env = Env::new();
    let store = env.open(kind, "s", 128, 0, 2);
    let range = KeyGroupRange::for_instance(128, 2, 0);
    let foreign = (0..)
        .map(key)
        .find(|k| !range.contains(key_group_for(k, 128)))
        .expect("a foreign key");
    assert!(store.key_state_json(&foreign).is_err());
}

fn restored_state_reads_the_same_and_unregistered_states_show_hex(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "a");
    fill(&store);
    let before = store.key_state_json(b"user-1").expect("lookup");
    let part = snapshot_to(&store, 1, &env.path("snap"));
    // Same handles registered, other backend or same: identical JSON.
    for other in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let restored = env.single(other, &format!("b-{other:?}"));
        fill(&restored);
        restored
            .restore(std::slice::from_ref(&part))
            .expect("restore");
        assert_eq!(restored.key_state_json(b"user-1").expect("lookup"), before);
    }
    // Nothing registered: the state is still listed, bytes as hex.
    let bare = env.single(kind, "bare");
    bare.restore(std::slice::from_ref(&part)).expect("restore");
    let got = bare
        .key_state_json(b"user-1")
        .expect("lookup")
        .expect("state");
    assert!(
        got["states"]["count"]["entries"][0]["value"]["hex"].is_string(),
        "{got:#}"
    );
}

on_every_backend!(
    every_state_of_a_key_is_decoded_with_its_expiry,
    expired_entries_are_hidden_and_the_lookup_changes_nothing,
    keys_of_other_instances_are_refused,
    restored_state_reads_the_same_and_unregistered_states_show_hex,
);
