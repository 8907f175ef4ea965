//! The admin API's request handling on arbitrary bytes: whatever a client sends on a
//! connection goes through hyper's HTTP/1 parser, the body cap, the token check and every
//! route's extractors and id validation, with a stand-in job loop answering. Never panics
//! or hangs, and every answer is one well-formed HTTP response that is not a 500.
#![no_main]
use libfuzzer_sys::fuzz_target;
use streamstate::admin::fuzzing::Harness;

fuzz_target!(|data: &[u8]| {
    thread_local! {
        static HARNESS: Harness = Harness::new().expect("admin fuzz harness");
    }
    HARNESS.with(|h| drop(h.check(data)));
});
