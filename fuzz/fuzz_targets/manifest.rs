//! The checkpoint manifest parser on arbitrary bytes: never panics; anything it accepts
//! names the expected checkpoint and only safe file paths.
#![no_main]
use libfuzzer_sys::fuzz_target;
use streamstate::checkpoint::{CheckpointRef, Manifest, is_safe_path};

fuzz_target!(|data: &[u8]| {
    let expected = CheckpointRef::new(7, "0badcafe");
    if let Ok(m) = Manifest::parse(data, &expected) {
        assert_eq!(m.checkpoint, expected);
        assert!(m.state.files.iter().all(|f| is_safe_path(&f.path)));
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = CheckpointRef::parse(s);
    }
});
