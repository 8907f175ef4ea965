//! The event decoder and key extraction on arbitrary record bytes: never panics, and a
//! decoded event's key respects the limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use streamstate::decode::Decoder;

fuzz_target!(|data: &[u8]| {
    let now_ms = 1_700_000_000_000;
    let plain = Decoder::new("/user_id", 64 * 1024, 64);
    let timed = Decoder::new("/a/0/b~1c", 64 * 1024, 64)
        .with_timestamp(Some("/ts"))
        .with_max_skew(Some(std::time::Duration::from_secs(86_400)));
    for d in [&plain, &timed] {
        match d.decode_at(Some(data), now_ms) {
            Ok(event) => assert!(event.key.len() <= 64),
            Err(e) => assert!(!e.reason().is_empty()),
        }
    }
});
